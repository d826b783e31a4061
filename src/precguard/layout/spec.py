"""The layout spec: how a tensor-parallel (and pipeline-parallel) run splits each module.

A spec is YAML validated by :class:`LayoutSpec`. Ranks form a grid: ``rank =
tp_rank + TP * (dp_rank + DP * stage)`` (Megatron's default order,
tensor-parallel ranks adjacent); data-parallel replica 0 is compared. Each
rule names modules by glob and says, per role, how the tensors of one call are
laid out across the tensor-parallel group:

- ``replicate``: every rank holds the whole tensor;
- ``{shard: D}``: each rank holds a contiguous slice along dimension ``D``, in
  rank order (column-parallel outputs along the last dim, sequence-parallel
  activations along the sequence dim);
- ``partial``: each rank holds a partial sum; the whole tensor is their sum
  (a row-parallel linear's output before its all-reduce).

Modules no rule matches are replicated. See docs/layouts.md.
"""

from __future__ import annotations

import fnmatch
from functools import cached_property
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from precguard.errors import UsageError
from precguard.text import shown

_STRICT = ConfigDict(frozen=True, extra="forbid")


class Shard(BaseModel):
    """Each rank of the group holds a contiguous slice along ``shard`` (negative: from the end)."""

    model_config = _STRICT

    shard: int = Field(description="Dimension split across the tensor-parallel group.")


Placement = Annotated[
    Literal["replicate", "partial"] | Shard,
    Field(description="'replicate', 'partial' (a sum awaiting a reduce) or {shard: DIM}."),
]
#: one placement for every tensor of the role, or one per index (the last repeats)
Placements = Placement | list[Placement]

Kind = Literal["column", "row", "replicate"]

_REPLICATE: Placement = "replicate"
_PARTIAL: Placement = "partial"
_LAST = Shard(shard=-1)

#: what each kind means when the rule does not say otherwise
_KIND_DEFAULTS: dict[str, dict[str, Any]] = {
    # y = x W_r^T: W split by rows (output features), x whole, y split along features
    "column": {
        "params": {"weight": Shard(shard=0), "bias": Shard(shard=0)},
        "inputs": _REPLICATE,
        "outputs": _LAST,
    },
    # y_r = x_r W_r^T: W split by columns (input features), x split, y a partial sum;
    # the bias is added once, after the reduce
    "row": {
        "params": {"weight": Shard(shard=-1), "bias": _REPLICATE},
        "inputs": _LAST,
        "outputs": _PARTIAL,
    },
    "replicate": {"params": {}, "inputs": _REPLICATE, "outputs": _REPLICATE},
}


class ModuleRule(BaseModel):
    """How the tensors of the modules that ``match`` are split across the tensor-parallel group.

    Gradients follow their forward tensors unless given: the gradient of a
    sharded tensor is sharded the same way; of a column-parallel module's
    replicated input, a partial sum (each rank's local contribution; say
    ``replicate`` when the module reduces it itself, as Megatron's
    ColumnParallelLinear does); any other is replicated.
    """

    model_config = _STRICT

    match: str | list[str] = Field(
        description="Module name glob(s). A glob matches the whole qualified name or its "
        "tail after a dot: 'linear_proj' matches 'decoder.layers.0.self_attention.linear_proj'."
    )
    kind: Kind = Field(
        default="replicate",
        description="column (weight split by output features, output split along the last "
        "dim), row (weight split by input features, input split, output a partial sum) or "
        "replicate; the fields below override what the kind implies.",
    )
    params: dict[str, Placement] | None = Field(
        default=None,
        description="Parameter name (as in named_parameters of the module, e.g. 'weight'; "
        "'*' for any other) -> placement of the parameter as recorded in forward. Names not "
        "listed are replicated.",
    )
    grads: dict[str, Placement] | None = Field(
        default=None,
        description="Parameter name -> placement of its gradient (backward, role 'grad'); "
        "default: as the parameter. FSDP2 gathers parameters for the forward but keeps "
        "their gradients sharded along dim 0.",
    )
    inputs: Placements | None = Field(default=None, description="Forward inputs.")
    outputs: Placements | None = Field(default=None, description="Forward outputs.")
    grad_inputs: Placements | None = Field(
        default=None, description="Gradients w.r.t. the inputs (backward, role 'input')."
    )
    grad_outputs: Placements | None = Field(
        default=None, description="Gradients w.r.t. the outputs (backward, role 'output')."
    )

    @field_validator("match")
    @classmethod
    def _globs(cls, v: str | list[str]) -> str | list[str]:
        if not v or (isinstance(v, list) and not all(v)):
            raise ValueError("needs at least one non-empty module glob")
        return v

    @property
    def globs(self) -> list[str]:
        """The module globs as a list."""
        return [self.match] if isinstance(self.match, str) else list(self.match)

    def matches(self, module: str) -> bool:
        """Return True when ``module`` (a qualified name) is named by one of the globs."""
        return any(fnmatch.fnmatchcase(module, g) or fnmatch.fnmatchcase(module, "*." + g)
                   for g in self.globs)  # fmt: skip

    @cached_property
    def resolved(self) -> _Resolved:
        """Every role's placements, the kind's defaults and gradient rules applied."""
        base = _KIND_DEFAULTS[self.kind]
        params = dict(base["params"]) if self.params is None else dict(self.params)
        grads = params if self.grads is None else dict(self.grads)
        inputs = _as_list(self.inputs if self.inputs is not None else base["inputs"])
        outputs = _as_list(self.outputs if self.outputs is not None else base["outputs"])
        if self.grad_inputs is not None:
            grad_inputs = _as_list(self.grad_inputs)
        else:
            grad_inputs = [_grad_of_input(p, self.kind) for p in inputs]
        if self.grad_outputs is not None:
            grad_outputs = _as_list(self.grad_outputs)
        else:
            grad_outputs = [p if isinstance(p, Shard) else _REPLICATE for p in outputs]
        return _Resolved(params, grads, inputs, outputs, grad_inputs, grad_outputs)


def _grad_of_input(p: Placement, kind: str) -> Placement:
    """The default placement of the gradient w.r.t. an input placed ``p``.

    A column-parallel module computes, from its replicated input, only its rank's
    contribution to that input's gradient: a partial sum. Elsewhere a sharded
    input's gradient is sharded alike and any other is replicated.
    """
    if isinstance(p, Shard):
        return p
    return _PARTIAL if kind == "column" and p == "replicate" else _REPLICATE


def _as_list(p: Placements) -> list[Placement]:
    return list(p) if isinstance(p, list) else [p]


class _Resolved:
    __slots__ = ("grad_inputs", "grad_outputs", "grads", "inputs", "outputs", "params")

    def __init__(
        self,
        params: dict[str, Placement],
        grads: dict[str, Placement],
        inputs: list[Placement],
        outputs: list[Placement],
        grad_inputs: list[Placement],
        grad_outputs: list[Placement],
    ) -> None:
        self.params = params
        self.grads = grads
        self.inputs = inputs
        self.outputs = outputs
        self.grad_inputs = grad_inputs
        self.grad_outputs = grad_outputs

    def placement(self, phase: str, role: str, index: int, name: str) -> Placement:
        if role in ("param", "grad"):
            table = self.params if role == "param" else self.grads
            pname = name.rsplit(".", 1)[-1]
            return table.get(pname, table.get("*", _REPLICATE))
        if phase == "forward":
            seq = self.inputs if role == "input" else self.outputs
        else:
            seq = self.grad_inputs if role == "input" else self.grad_outputs
        return seq[min(index, len(seq) - 1)]


class LayoutSpec(BaseModel):
    """A parallel layout: the rank grid and, by module glob, how tensors are split."""

    model_config = _STRICT

    name: str = Field(default="layout", description="A name shown in reports.")
    description: str = Field(default="", description="What runs this layout describes.")
    tensor_parallel: int | None = Field(
        default=None,
        ge=1,
        description="Tensor-parallel group size (default: world size / pipeline_stages).",
    )
    pipeline_stages: int = Field(
        default=1,
        ge=1,
        description="Pipeline stages. Stage s of replica 0 holds ranks s*TP*DP .. "
        "s*TP*DP+TP-1; records of all "
        "stages are merged in execution order (forward: stage 0 first; backward: last first).",
    )
    data_parallel: int = Field(
        default=1,
        ge=1,
        description="Data-parallel replicas of the whole tensor-/pipeline-parallel model. "
        "Only replica 0 is gathered and compared; the others are not read.",
    )
    modules: list[ModuleRule] = Field(
        default_factory=list,
        description="Rules, first match wins; unmatched modules are replicated.",
    )

    def rule_for(self, module: str) -> ModuleRule | None:
        """The first rule naming ``module``, or None (replicated)."""
        for rule in self.modules:
            if rule.matches(module):
                return rule
        return None

    def placement(self, module: str, phase: str, role: str, index: int, name: str) -> Placement:
        """How the record of ``module`` with this phase, role, index and name is split."""
        rule = self.rule_for(module)
        if rule is None:
            return _REPLICATE
        return rule.resolved.placement(phase, role, index, name)

    def grid(self, world_size: int) -> list[list[int]]:
        """The ranks of each pipeline stage of replica 0, in tensor-parallel order.

        Ranks are numbered as Megatron numbers them by default (tensor-parallel
        fastest, then data-parallel, then pipeline): ``rank = tp_rank + TP *
        (dp_rank + DP * stage)``.
        """
        pp, dp = self.pipeline_stages, self.data_parallel
        tp = self.tensor_parallel or world_size // (pp * dp)
        if tp < 1 or tp * pp * dp != world_size:
            raise UsageError(
                f"layout {self.name!r}: {world_size} rank(s) are not {pp} pipeline stage(s) x "
                f"{dp} data-parallel replica(s) x tensor_parallel {self.tensor_parallel or '?'}"
            )
        return [[t + tp * dp * s for t in range(tp)] for s in range(pp)]


def builtin_layouts() -> dict[str, Path]:
    """Shipped layout specs by name (``megatron``, ``llama``, ``column-row``)."""
    root = resources.files("precguard") / "layouts"
    out = {}
    for entry in root.iterdir():
        if entry.name.endswith(".yaml"):
            out[entry.name.removesuffix(".yaml")] = Path(str(entry))
    return dict(sorted(out.items()))


#: a layout is a handful of rules: the shipped ones are under 4 KiB
MAX_LAYOUT_BYTES = 256 * 1024
#: nesting a layout never needs (rules -> rule -> placements -> placement -> dims)
MAX_LAYOUT_DEPTH = 32


def _load_bounded_yaml(path: Path) -> Any:
    """Parse ``path`` as YAML after checking its size, nesting and aliases.

    PyYAML builds nested documents recursively (10,000 levels raise
    RecursionError) and its pure-Python parser takes minutes on megabytes, so
    the size is checked before reading and the depth on the event stream
    before anything is built. Aliases are refused: a layout never needs them,
    and expanding them is how a kilobyte becomes gigabytes.
    """
    from precguard.dump.untrusted import read_bytes

    # a regular file (a FIFO would hang the read), refused unread past the limit
    data = read_bytes(path, limit=MAX_LAYOUT_BYTES, what="layout spec", error=UsageError)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UsageError(f"--layout {shown(path)}: not UTF-8 text; not a layout spec") from exc
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    depth = 0
    for event in yaml.parse(text, Loader=loader):
        if isinstance(event, yaml.AliasEvent):
            raise UsageError(f"--layout {shown(path)}: YAML aliases are not allowed in a layout")
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_LAYOUT_DEPTH:
                raise UsageError(
                    f"--layout {shown(path)}: nested deeper than {MAX_LAYOUT_DEPTH} levels; "
                    "not a layout spec"
                )
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return yaml.load(text, Loader=loader)  # a safe loader (SafeLoader or its C form)


def load_layout(spec: str | Path | LayoutSpec) -> LayoutSpec:
    """Load a layout spec from a YAML file or a shipped name; raise UsageError naming the fault.

    >>> load_layout("megatron").rule_for("decoder.layers.0.mlp.linear_fc1").kind
    'column'
    """
    if isinstance(spec, LayoutSpec):
        return spec
    path = Path(spec)
    if not path.is_file():
        shipped = builtin_layouts()
        if str(spec) not in shipped:
            raise UsageError(
                f"--layout {shown(str(spec))}: no such file, and not a shipped layout "
                f"({', '.join(shipped)})"
            )
        path = shipped[str(spec)]
    try:
        raw = _load_bounded_yaml(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--layout {shown(path)}: cannot read ({exc})") from exc
    except yaml.YAMLError as exc:
        raise UsageError(f"--layout {shown(path)}: not valid YAML ({shown(exc, 120)})") from exc
    if not isinstance(raw, dict):
        raise UsageError(f"--layout {shown(path)}: expected a mapping at the top")
    try:
        return LayoutSpec.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise UsageError(
            f"--layout {shown(path)}: field '{shown(loc, 60)}': {shown(err['msg'], 160)}"
        ) from exc


def layout_schema() -> dict[str, Any]:
    """The JSON Schema of a layout spec (``precguard schema layout``)."""
    return LayoutSpec.model_json_schema()
