"""Replay one module alone: golden inputs in, compare its output with the golden output.

Compare tells which module *seems* to introduce error; replay confirms it.
The module runs by itself on the device under test, fed the exact tensors
it received in the golden run, so every difference in its output is error
it makes itself (its *local error*), with no upstream error mixed in.

It runs in the dtype ``precguard record`` uses on that device (the device's
model dtype, else float32) unless ``dtype`` says otherwise, and each output is
judged by the error a correct module explains at the precision it ran in
(:func:`replay_expected_error`): its inputs rounded to the replay dtype, one
rounding in the compute precision and the accumulation of its reductions. A
named tolerance profile judges by fixed tolerances instead.
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.table import Table
from rich.text import Text

from precguard._logging import get_logger
from precguard.capture.flatten import named_tensors
from precguard.compare.levels import FullMetrics
from precguard.compare.metrics import golden_rms, tensor_metrics
from precguard.compare.render import format_cosine, format_number
from precguard.compare.report import Metrics, Status
from precguard.compare.tolerance import Profile, get_profile, judge
from precguard.devices import dtype_name
from precguard.dump.reader import Run, load_run
from precguard.dump.schema import Record
from precguard.dump.tensors import TensorStore
from precguard.errors import DumpFormatError, PrecguardError, UsageError
from precguard.numerics import (
    REPLAY_MARGIN,
    expected_error,
    less_precise,
    measure,
    reduction_length,
    status,
)
from precguard.text import shown

if TYPE_CHECKING:
    from precguard.target_run import Side

logger = get_logger(__name__)

_FROZEN = ConfigDict(frozen=True, ser_json_inf_nan="strings")


class ReplayOutput(BaseModel):
    """One output of the replayed module against the golden output."""

    model_config = _FROZEN

    key: str = Field(description="Golden record key of this output.")
    name: str = Field(description="Where the tensor sits in the output ('output', 'output.0').")
    status: Status = Field(description="pass, fail, nonfinite, or missing (not produced).")
    metrics: Metrics | None = Field(default=None, description="Local error metrics.")
    expected_error: float | None = Field(
        default=None,
        description="Relative L2 error a correct module explains at the replay's precision "
        "(None when judged by a fixed profile); the output fails beyond REPLAY_MARGIN times it.",
    )


class ReplayResult(BaseModel):
    """The local error of one module replayed on a device."""

    model_config = _FROZEN

    golden: str = Field(description="Golden recording directory.")
    module: str = Field(description="Qualified module name.")
    module_type: str = Field(description="Its class name.")
    device: str = Field(description="Device the module ran on.")
    dtype: str = Field(description="dtype the module ran in.")
    step: int = Field(description="Step whose inputs were replayed.")
    call: int = Field(description="Call of the module that was replayed.")
    profile: str = Field(
        description="'expected': judged by the expected error at the replay's precision; "
        "else the fixed tolerance profile asked for."
    )
    precision: str = Field(
        default="float32",
        description="Precision the module computed in: the replay dtype, or the device's "
        "lower compute precision (an emu: profile's).",
    )
    verdict: Literal["match", "diverged"] = Field(
        description="'match' when every output is within tolerance: the module is not at fault."
    )
    local_error: float = Field(description="Largest output error (relative L2 for full tensors).")
    outputs: list[ReplayOutput] = Field(description="Each output of the module.")
    warnings: list[str] = Field(default_factory=list, description="Caveats.")


def replay_module(
    golden: str | os.PathLike[str],
    module: str,
    *,
    target: str | Side | None = None,
    device: str | None = None,
    dtype: str | None = None,
    call: int = 0,
    step: int = 0,
    rank: int = 0,
    profile: str | None = None,
) -> ReplayResult:
    """Run ``module`` of ``target`` alone on ``device`` with the golden's inputs.

    ``target`` is a :class:`~precguard.Side` (the one way: ``replay_module(golden, name,
    target=Side("tiny-llama", "npu"))``) or a target spec with ``device`` (None:
    ``"cpu"``) and ``dtype`` as keywords. It is required: the golden's manifest
    names the target it was recorded from, but a recording is untrusted input and
    never chooses the code that runs (the name is only suggested in the error).

    The golden must hold full tensors of the module's inputs and outputs
    (recorded with ``tensors=["NAME"]`` or ``tensors=True``); a missing tensor
    is named in the error. Weights come from the target, built the way
    ``precguard record`` builds it (seeded, on the CPU, then moved), in ``dtype``
    or else the dtype ``record`` uses on ``device``. ``profile`` None judges each
    output by its expected error (:func:`replay_expected_error`); a profile name
    by that profile's fixed tolerances.

    >>> r = replay_module("runs/cpu", "model.layers.3.mlp", target="tiny-llama",
    ...                   device="npu")                                  # doctest: +SKIP
    >>> r.verdict, r.local_error                                           # doctest: +SKIP
    ('diverged', 0.0031)
    """
    from precguard.target_run import one_side

    run = load_run(golden)
    prof = get_profile(profile or "default")
    if rank not in run.ranks:
        raise UsageError(f"{shown(run.path)}: has no rank {rank} (ranks: {run.ranks or 'none'})")
    records = _module_records(run.records(rank), module, call, step)
    if not records:
        raise UsageError(
            f"{shown(run.path)}: no forward records of module {shown(repr(module))} "
            f"(call {call}, step {step}, rank {rank}); check the name with the golden's "
            "records.jsonl"
        )
    inputs = [r for r in records if r.role == "input"]
    outputs = [r for r in records if r.role == "output"]
    params = [r for r in records if r.role == "param"]
    missing = [r.key for r in inputs + outputs if r.tensor is None]
    if missing:
        raise DumpFormatError(
            f"{shown(run.path)}: no full tensors for {shown(', '.join(missing), 400)}; record "
            f"the golden with --tensors '{shown(module)}' to replay it"
        )
    if not target:
        raise UsageError(missing_target_message(run))
    side = one_side(target, "replay_module", device=device, dtype=dtype)
    target_spec = side.target if isinstance(side.target, str) else side.target.name
    # dtype None: what `record` uses on the device (its model dtype), not float32
    setup = side.open()
    torch_dtype, backend = setup.dtype, setup.backend
    model = setup.prepared(setup.build_model())
    model.eval()
    try:
        sub = model if module == "root" else model.get_submodule(module)
    except AttributeError as exc:
        raise UsageError(f"target {target_spec!r} has no module {module!r}") from exc
    store = TensorStore(run.path)
    warnings = _check_weights(sub, params, store)
    tdev = backend.torch_device()
    try:
        args, kwargs = _rebuild_call(inputs, store, tdev, torch_dtype, warnings)
        with backend.numerics(), torch.no_grad():
            produced = sub(*args, **kwargs)
            backend.synchronize()
        got = dict(named_tensors(produced, "output"))
        prec = replay_precision(torch_dtype, backend.compute_dtype())
        expected = (
            None
            if profile
            else replay_expected_error(inputs, store, torch_dtype, prec, layer_reduction(sub))
        )
        results = [_judge_output(o, got.get(o.name), store, prof, expected) for o in outputs]
    finally:
        store.close()
    errors = [r.metrics.error for r in results if r.metrics is not None]
    verdict: Literal["match", "diverged"] = (
        "match" if all(r.status == "pass" for r in results) else "diverged"
    )
    return ReplayResult(
        golden=str(run.path),
        module=module,
        module_type=records[0].module_type,
        device=side.device,
        dtype=dtype_name(torch_dtype),
        step=step,
        call=call,
        profile=prof.name if profile else "expected",
        precision=prec,
        verdict=verdict,
        local_error=max(errors, default=0.0),
        outputs=results,
        warnings=warnings,
    )


def missing_target_message(run: Run) -> str:
    """The error for a replay without a target: the manifest's target only as a suggestion."""
    named = run.manifest.target
    hint = (
        f"the golden was recorded from {shown(named, 80)}; if you trust that code, pass "
        f"--target {shown(named, 80)}"
        if named
        else "the golden's manifest names none"
    )
    return (
        f"{shown(run.path)}: replay needs --target (the model code to run); a recording "
        f"never chooses the code that runs: {hint}"
    )


def _module_records(records: Any, module: str, call: int, step: int) -> list[Record]:
    found: list[Record] = []
    for rec in records:
        if rec.step > step and found:
            break
        if (rec.module, rec.call, rec.step, rec.phase) == (module, call, step, "forward"):
            found.append(rec)
    return found


def _check_weights(sub: torch.nn.Module, params: list[Record], store: TensorStore) -> list[str]:
    """Warn when the target's weights are not the golden's: the replay would mislead."""
    warnings: list[str] = []
    own = dict(sub.named_parameters(recurse=False))
    for rec in params:
        p = own.get(rec.name)
        if p is None or rec.tensor is None:
            continue
        mine = p.detach().to("cpu")
        # the golden rounded to the replay dtype: a dtype cast alone is not a difference
        if not torch.equal(store.tensor(rec).to(mine.dtype), mine):
            warnings.append(
                f"parameter {shown(repr(rec.name))} of the target differs from the golden's: "
                "the replay measures different weights"
            )
    return warnings


def _rebuild_call(
    inputs: list[Record],
    store: TensorStore,
    device: torch.device,
    dtype: torch.dtype,
    warnings: list[str],
) -> tuple[list[Any], dict[str, Any]]:
    """Rebuild ``(args, kwargs)`` from input record names (``kwargs.position_embeddings.0``)."""
    tree: dict[str, Any] = {"args": {}, "kwargs": {}}
    for rec in inputs:
        parts = _input_path(rec)
        node = tree[parts[0]]
        for part in parts[1:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise _bad_name(rec)
        if parts[-1] in node:
            raise _bad_name(rec)
        t = store.tensor(rec).clone()
        if t.is_floating_point():
            t = t.to(dtype)
        node[parts[-1]] = t.to(device)
    args_tree = tree["args"]
    n_args = max((int(k) + 1 for k in args_tree), default=0)
    if len(args_tree) < n_args:
        warnings.append("some positional inputs were not tensors and are replayed as None")
    args = [_materialize(args_tree.get(str(i))) for i in range(n_args)]
    kwargs = {k: _materialize(v) for k, v in tree["kwargs"].items()}
    return args, kwargs


#: an index in an input's name (``args.0``, ``kwargs.past.1``); bounded so that a
#: crafted name cannot ask for a tuple of a billion Nones
_INDEX = re.compile(r"0|[1-9][0-9]{0,3}", re.ASCII)
#: deepest nesting of an input's name
_MAX_NAME_PARTS = 16


def _input_path(rec: Record) -> list[str]:
    """The parts of an input record's name, checked: ``args.N...`` or ``kwargs.NAME...``."""
    parts = rec.name.split(".")
    if (
        len(parts) < 2
        or len(parts) > _MAX_NAME_PARTS
        or parts[0] not in ("args", "kwargs")
        or not all(parts)
        or (parts[0] == "args" and not _INDEX.fullmatch(parts[1]))
    ):
        raise _bad_name(rec)
    return parts


def _bad_name(rec: Record) -> DumpFormatError:
    return DumpFormatError(
        f"input record {shown(rec.key)}: unexpected or repeated name {shown(rec.name, 80)}"
    )


def _materialize(node: Any) -> Any:
    """Turn ``{"0": a, "1": b}`` into ``(a, b)``; other dicts stay dicts."""
    if not isinstance(node, dict):
        return node
    if node and all(_INDEX.fullmatch(k) for k in node):
        return tuple(_materialize(node.get(str(i))) for i in range(max(int(k) for k in node) + 1))
    return {k: _materialize(v) for k, v in node.items()}


def replay_precision(dtype: torch.dtype, compute: torch.dtype | str | None) -> str:
    """The precision a replay computes in: its dtype, or the device's lower compute precision."""
    name = dtype_name(dtype)
    return name if compute is None else less_precise(name, str(compute).removeprefix("torch."))


def layer_reduction(module: torch.nn.Module) -> int | None:
    """The longest dot product a module computes, as far as its layers tell (None: unknown).

    :func:`~precguard.numerics.reduction_length` of the in-features of its (or its
    children's) linear layers; it sets the accumulation term ``sqrt(k) * u_acc`` of
    :func:`~precguard.numerics.rounding_floor`.
    """
    widths = [
        int(m.in_features)
        for m in module.modules()
        if isinstance(getattr(m, "in_features", None), int)
    ]
    return reduction_length(widths=widths)


def replay_expected_error(
    inputs: list[Record], store: TensorStore, dtype: torch.dtype, precision: str, k: int | None
) -> float:
    """The relative error a correct module's output carries when replayed in ``dtype``.

    The golden inputs, rounded to ``dtype``, carry an error measured here (their
    relative L2 change, :func:`~precguard.numerics.measure`); the module adds one rounding
    in ``precision`` and the accumulation of length-``k`` reductions
    (:func:`~precguard.numerics.expected_error`). An input that is zero or not finite
    on golden tells nothing of a rounding's size and is skipped.
    """
    input_error = 0.0
    for rec in inputs:
        if rec.tensor is None:
            continue
        g = store.tensor(rec)
        if not g.is_floating_point() or g.numel() == 0:
            continue
        if not bool(torch.isfinite(g).all()) or not bool(g.any()):
            continue
        input_error = max(input_error, measure(g.to(dtype), g).rel_l2)
    return expected_error(input_error, precision, k)


def _judge_output(
    rec: Record,
    tensor: torch.Tensor | None,
    store: TensorStore,
    profile: Profile,
    expected: float | None = None,
) -> ReplayOutput:
    if tensor is None:
        return ReplayOutput(key=rec.key, name=rec.name, status="missing")
    golden = store.tensor(rec)
    actual = tensor.detach().to("cpu")
    if golden.numel() != actual.numel():
        raise PrecguardError(
            f"replayed output {shown(rec.name)} has shape {list(actual.shape)}, golden "
            f"{shown(rec.shape, 60)}"
        )
    metrics = tensor_metrics(
        golden,
        actual,
        golden_dtype=rec.dtype,
        actual_dtype=dtype_name(actual.dtype),
        profile=profile,
        golden_rms=golden_rms(rec.stats),
    )
    status = judge(metrics, profile) if expected is None else judge_by_expected(metrics, expected)
    return ReplayOutput(
        key=rec.key, name=rec.name, status=status, metrics=metrics, expected_error=expected
    )


def judge_by_expected(metrics: Metrics, expected: float) -> Status:
    """``pass`` while a replayed output's error is within :data:`~precguard.numerics.
    REPLAY_MARGIN` x expected (the ladder of :func:`precguard.numerics.status`)."""
    return status(metrics, REPLAY_MARGIN * expected)


def render_replay(result: ReplayResult, console: Console) -> None:
    """Print a replay result: verdict, then one row per output."""
    style = "bold green" if result.verdict == "match" else "bold red"
    word = "MATCH" if result.verdict == "match" else "DIVERGED"
    console.print(
        Text.assemble(
            (word, style),
            f"  {shown(result.module)} ({shown(result.module_type)}) replayed alone on "
            f"{shown(result.device)} "
            f"({result.dtype}) with golden inputs: local error {result.local_error:.3g}"
            + _expected_note(result),
        )
    )
    table = Table()
    for col in ("output", "status", "rel_l2", "expected", "cosine", "max_abs"):
        table.add_column(col)
    for o in result.outputs:
        m = o.metrics if isinstance(o.metrics, FullMetrics) else None  # exact: ids, no norms
        table.add_row(
            shown(o.name, markup=True),
            o.status,
            format_number(m.rel_l2 if m else None),
            format_number(o.expected_error),
            format_cosine(m.cosine if m else None),
            format_number(m.max_abs_err if m else None),
        )
    console.print(table)
    within = "its expected error" if result.profile == "expected" else "tolerance"
    if result.verdict == "match":
        console.print(
            f"the module itself is within {within}: its error in compare came from upstream"
        )
    else:
        console.print(f"the module itself is outside {within} on this device: the error is local")
    for w in result.warnings:
        console.print(f"[yellow]warning:[/] {shown(w, 400, markup=True)}")


def _expected_note(result: ReplayResult) -> str:
    expected = [o.expected_error for o in result.outputs if o.expected_error is not None]
    if result.profile != "expected" or not expected:
        return f" (profile {result.profile})"
    return (
        f"; a correct module explains {max(expected):.3g} at {result.precision} "
        f"(fails beyond {REPLAY_MARGIN:g}x)"
    )


__all__ = [
    "REPLAY_MARGIN",
    "ReplayOutput",
    "ReplayResult",
    "judge_by_expected",
    "render_replay",
    "replay_expected_error",
    "replay_module",
]
