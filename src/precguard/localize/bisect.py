"""Bisect: which modules must run at reference precision for the output to be right?

No golden recording is needed. The target's model is built twice from one seed: on
the reference (e.g. the CPU in fp32) for the trusted output, and on the device under
test. A *probe* reruns the device forward with a set of modules swapped for their
reference twins (:class:`ReferencePrecision`), and its output error says whether that
set is enough. :class:`Bisector` searches the top-level units with QuickXplain, refines
each culprit into its children and drops what a linear pass shows is not needed; a
non-finite device output is traced to the module whose output first leaves the
format's range (:func:`find_overflow`). docs/bisect.md says how and why.

Probes are cached by the set they test. The user's model is never touched:
both models are private builds, and every swapped ``forward`` is restored.

>>> result = bisect(Side("tiny-llama", "emu:fp16"))     # doctest: +SKIP
>>> result.culprits, result.probe_count                 # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from precguard import tree
from precguard._logging import get_logger
from precguard.backend import Backend
from precguard.capture.hooks import HookHandle, NonFiniteOrigin, on_calls, replace_forward
from precguard.devices import dtype_name
from precguard.errors import ExitCode, TargetError, UsageError
from precguard.numerics import (
    CORRECT_RUN_GROWTH,
    SIGNIFICAND_BITS,
    cosine_distance,
    measure,
    rounding_floor,
    unit_roundoff,
)
from precguard.oracle import map_tensors_keeping_types
from precguard.target import Target, call_model
from precguard.target_run import Side, TargetRun, golden_side, one_side

logger = get_logger(__name__)

_FROZEN = ConfigDict(frozen=True, ser_json_inf_nan="strings")


def precision_eps(precision: torch.dtype | str) -> float:
    """Machine epsilon of a dtype or of a backend's named precision (``tfloat32``, ``hfloat32``)."""
    name = str(precision).removeprefix("torch.")
    if name not in SIGNIFICAND_BITS:
        raise UsageError(f"unknown compute precision {name!r}")
    return 2 * unit_roundoff(name)


def least_threshold(compute: torch.dtype | str, length: int | None = None) -> float:
    """The smallest threshold of an output of ``length`` elements along its last dimension.

    One rounding in ``compute`` and one reduction of that length in another order
    (:func:`precguard.numerics.rounding_floor`): the error two correct runs of any
    depth differ by at least. It rules where the floor probe cannot see a device's
    difference, a float32 device with another reduction order (rounding float32 values
    to float32 changes nothing).
    """
    return rounding_floor(str(compute).removeprefix("torch."), length)


def correct_threshold(floor: float, compute: torch.dtype | str, length: int | None = None) -> float:
    """The ``rel_l2`` threshold of one output: :data:`CORRECT_RUN_GROWTH` times its floor.

    ``floor`` is that output's error in the floor probe (:data:`CORRECT_RUN_GROWTH`), at
    least :func:`least_threshold`. An infinite floor (values beyond the format's range
    even when every leaf is right) leaves the threshold infinite: no set of modules at
    reference precision can be asked to do better than the format.
    """
    return max(CORRECT_RUN_GROWTH * floor, least_threshold(compute, length))


def round_to_precision(t: torch.Tensor, precision: torch.dtype | str) -> torch.Tensor:
    """``t`` rounded once (to nearest, ties to even) to ``precision``'s significand.

    A torch dtype by a cast there and back (its range too: overflow gives inf); a named
    precision (``tfloat32``) by its significand bits, float32's range kept.
    """
    if not t.is_floating_point():
        return t
    if isinstance(precision, torch.dtype):
        return t.to(precision).to(t.dtype)
    bits = SIGNIFICAND_BITS[str(precision)]
    mantissa, exponent = torch.frexp(t)
    return torch.ldexp(torch.round(mantissa * 2.0**bits) / 2.0**bits, exponent).to(t.dtype)


ROOT = "root"


def module_path(name: str) -> str:
    """The ``get_submodule`` path of a qualified module name (the root is ``""``)."""
    return "" if name == ROOT else name


def output_error(actual: torch.Tensor, expected: torch.Tensor, metric: str = "rel_l2") -> float:
    """The error of ``actual`` against ``expected`` (fp64): inf when ``actual`` is not finite.

    ``rel_l2`` ||a-e||/||e||, ``max_abs`` max|a-e|, ``mean_abs`` mean|a-e|,
    ``max_rel`` max|a-e|/max|e| (the error figures of :func:`precguard.numerics.measure`,
    the one measure), ``cosine`` 1 - cos(a, e) (:func:`~precguard.numerics.cosine_distance`).
    """
    a = actual.detach().to("cpu", torch.float64).flatten()
    e = expected.detach().to("cpu", torch.float64).flatten()
    if a.shape != e.shape:
        raise UsageError(
            f"the device output has {a.numel()} elements, the reference {e.numel()}: "
            "they cannot be compared"
        )
    if not bool(torch.isfinite(a).all()):
        return math.inf
    if metric in ("rel_l2", "max_abs", "mean_abs", "max_rel"):
        return float(getattr(measure(a, e), metric))
    if metric == "cosine":
        return cosine_distance(a, e)
    raise UsageError(f"unknown metric {metric!r}; expected one of: {', '.join(METRICS)}")


METRICS: tuple[str, ...] = ("rel_l2", "max_abs", "mean_abs", "max_rel", "cosine")


class Probe(BaseModel):
    """One forward on the device with some modules at reference precision."""

    model_config = _FROZEN

    index: int = Field(description="0-based order of the probe.")
    at_reference: list[str] = Field(description="Modules run at reference precision.")
    error: float = Field(
        description="Output error against the reference (the metric): the worst of the "
        "model's floating outputs."
    )
    passed: bool = Field(description="True when the error is within the threshold.")
    outputs: dict[str, float] = Field(
        default_factory=dict,
        description="The error of each floating output ('output' for a lone tensor, "
        "'output.logits', 'output.0' for the loss of a (loss, logits) tuple).",
    )


class Overflow(BaseModel):
    """The module whose output first left the format's range on the device."""

    model_config = _FROZEN

    module: str = Field(description="Qualified module name ('root' for the root module).")
    module_type: str = Field(description="Its class name.")
    format: str = Field(description="The device's compute precision whose range was left.")
    format_max: float = Field(description="Largest finite value of that format.")
    nonfinite: int = Field(description="NaN/Inf elements of its output on the device.")
    saturated: int = Field(description="Elements at ±format_max (saturated) on the device.")
    device_absmax: float = Field(description="Largest finite |value| of its device output.")
    input_absmax: float = Field(description="Largest |value| of its inputs on the device.")
    reference_absmax: float | None = Field(
        default=None,
        description="Largest |value| of the same output on the reference (beyond format_max: "
        "the values themselves exceed the format; None: not measured).",
    )

    def describe(self) -> str:
        """One line for the terminal."""
        ref = (
            f"; on the reference its output reaches {self.reference_absmax:.4g}"
            if self.reference_absmax is not None
            else ""
        )
        got = f"{self.nonfinite} NaN/Inf" if self.nonfinite else f"{self.saturated} saturated"
        return (
            f"{self.module} ({self.module_type}) is the first module whose output leaves "
            f"{self.format}'s range (max {self.format_max:.5g}): {got} element(s), inputs "
            f"within |x| <= {self.input_absmax:.4g}{ref}"
        )


class BisectResult(BaseModel):
    """The smallest set of modules whose reference precision fixes the output."""

    model_config = _FROZEN

    schema_version: int = Field(default=1, description="Format version of this file.")
    target: str = Field(description="Target spec.")
    device: str = Field(description="Device under test.")
    dtype: str = Field(description="Model dtype on the device.")
    reference: str = Field(description="Reference device.")
    reference_dtype: str = Field(description="Model dtype on the reference.")
    metric: str = Field(description="Error metric of the final output.")
    threshold: float = Field(
        description="The threshold of the output furthest beyond its own (an output error at "
        "or below its threshold passes)."
    )
    thresholds: dict[str, float] = Field(
        default_factory=dict,
        description="Per floating output, its threshold: CORRECT_RUN_GROWTH times its floor "
        "error, or the one --threshold given.",
    )
    floor_errors: dict[str, float] = Field(
        default_factory=dict,
        description="Per floating output, its error in the floor probe: every leaf module at "
        "reference precision, its output rounded once to the device's format (empty when "
        "--threshold was given).",
    )
    culprits: list[str] = Field(
        description="Modules that must run at reference precision (empty: already fine)."
    )
    probes: list[Probe] = Field(description="Every probe run, in order.")
    probe_count: int = Field(description="Number of probes (forwards on the device).")
    units: int = Field(description="Top-level modules the search started from.")
    baseline_error: float = Field(
        description="Output error with every module on the device (the worst output)."
    )
    output_errors: dict[str, float] = Field(
        default_factory=dict,
        description="Per floating output of the model, its error with every module on the "
        "device: each is judged, so a loss within the threshold never hides its logits.",
    )
    fixed_error: float = Field(description="Output error with the culprits at reference.")
    overflow: Overflow | None = Field(
        default=None,
        description="When the device output is not finite: the module whose output first "
        "left the format's range, with its values.",
    )
    note: str | None = Field(default=None, description="What the search could not do, if any.")

    @property
    def exit_code(self) -> int:
        """0 when the device output is within the threshold, 1 when culprits or an overflow
        were found."""
        return ExitCode.FAIL if self.culprits or self.overflow is not None else ExitCode.PASS


def forward_once(
    backend: Backend,
    model: nn.Module,
    batch: Any,
    contexts: Iterable[contextlib.AbstractContextManager[Any]] = (),
) -> Any:
    """``model`` called on ``batch`` without grad, inside ``contexts`` (entered in order, a
    generator's made there) and then ``backend``'s numerics; synchronized before it returns."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(torch.no_grad())
        for context in contexts:
            stack.enter_context(context)
        stack.enter_context(backend.numerics())
        out = call_model(model, batch)
    backend.synchronize()
    return out


class Twins:
    """The target built once from its seed, on both sides: ``model`` on the actual's device
    and dtype, ``reference_model`` on the golden's, and batch ``step`` cast for each.

    ``run``'s ``prepare`` (its Side's) alters the built model before it is copied, so both
    copies carry it (tests plant faults with it). ``keep_constructed`` also keeps the built
    model in float32 on the CPU, before any cast (``constructed``: buffers as constructed).
    """

    def __init__(
        self, run: TargetRun, golden: TargetRun, *, step: int = 0, keep_constructed: bool = False
    ) -> None:
        self.run, self.golden, self.step = run, golden, step
        built = run.prepared(run.construct())  # before the copy: both models carry it
        built.eval()
        self.constructed = copy.deepcopy(built) if keep_constructed else None
        self.reference_model = copy.deepcopy(built).to(
            device=golden.torch_device, dtype=golden.dtype
        )
        self.model = built.to(device=run.torch_device, dtype=run.dtype)
        self.batch = run.batch(step)
        self.reference_batch = _cast_batch(run.move(self.batch, golden.torch_device), golden.dtype)
        self.device_batch = _cast_batch(run.move(self.batch), run.dtype)

    @property
    def reference(self) -> Backend:
        """The golden's backend (where the reference copy runs)."""
        return self.golden.backend

    def forward_reference(self) -> Any:
        """The reference copy's output on its batch."""
        return forward_once(self.reference, self.reference_model, self.reference_batch)


# -- swapping modules for their reference twins ----------------------------------------------


@contextlib.contextmanager
def _outside_device() -> Iterator[None]:
    """Leave the device's dispatch modes (the ``emu:`` emulator) and autocast for a while."""
    with contextlib.ExitStack() as stack:
        stack.enter_context(_disable_current_modes())
        stack.enter_context(torch.autocast("cpu", enabled=False))
        if torch.cuda.is_available():
            stack.enter_context(torch.autocast("cuda", enabled=False))
        yield


class ReferencePrecision:
    """Run named modules of ``model`` on their twins in ``reference_model`` (a context manager).

    Inside the context, calling one of those modules on the device model calls
    the module of the same name in the reference model instead: floating inputs
    cast to ``dtype`` on ``device``, the reference backend's numerics around it,
    outside the device's numerics; floating outputs come back on the device in
    the dtype of the module's first floating input (the model's dtype when it
    has none, e.g. an embedding). Hooks on the device module still run. On exit
    every ``forward`` is restored exactly as it was.
    """

    def __init__(
        self,
        model: nn.Module,
        reference_model: nn.Module,
        names: Sequence[str],
        reference: Backend,
        dtype: torch.dtype,
    ) -> None:
        self.model = model
        self.reference_model = reference_model
        self.names = list(names)
        self.reference = reference
        self.dtype = dtype
        self._swaps: list[HookHandle] = []

    def _wrapper(self, module: nn.Module, twin: nn.Module) -> Callable[..., Any]:
        param = next(module.parameters(), None)
        model_dtype = param.dtype if param is not None and param.is_floating_point() else None
        ref_device = self.reference.torch_device()
        dtype = self.dtype
        numerics = self.reference.numerics

        def at_reference(*args: Any, **kwargs: Any) -> Any:
            first = tree.first_tensor((args, kwargs))
            anchor = first
            if anchor is None:
                anchor = tree.first_tensor((args, kwargs), floating=False)
            out_dtype = first.dtype if first is not None else model_dtype
            out_device = anchor.device if anchor is not None else None

            def inward(t: torch.Tensor) -> torch.Tensor:
                t = t.to(ref_device)
                return t.to(dtype) if t.is_floating_point() else t

            def outward(t: torch.Tensor) -> torch.Tensor:
                if out_device is not None:
                    t = t.to(out_device)
                if t.is_floating_point() and out_dtype is not None:
                    t = t.to(out_dtype)
                return t

            ref_args = map_tensors_keeping_types(args, inward)
            ref_kwargs = map_tensors_keeping_types(kwargs, inward)
            with _outside_device(), numerics():
                out = twin(*ref_args, **ref_kwargs)
            return map_tensors_keeping_types(out, outward)

        return at_reference

    def __enter__(self) -> ReferencePrecision:
        # the module's forward is replaced, not its output (capture.hooks.replace_forward
        # says why): the device module must not run at all
        try:
            for name in self.names:
                module = self.model.get_submodule(module_path(name))
                twin = self.reference_model.get_submodule(module_path(name))
                self._swaps.append(replace_forward(module, self._wrapper(module, twin)))
        except BaseException:
            self._restore()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._restore()

    def _restore(self) -> None:
        while self._swaps:
            self._swaps.pop().remove()


class RoundedReference(ReferencePrecision):
    """:class:`ReferencePrecision` whose modules take inputs and hand back outputs rounded
    once to ``precision``.

    The floor probe of :data:`CORRECT_RUN_GROWTH`: every leaf computed right, each
    hand-off stored in the device's format, as a correct device must store it.
    """

    def __init__(self, *args: Any, precision: torch.dtype | str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.precision = precision

    def _wrapper(self, module: nn.Module, twin: nn.Module) -> Callable[..., Any]:
        inner = super()._wrapper(module, twin)
        precision = self.precision

        def rounded(*args: Any, **kwargs: Any) -> Any:
            # what reaches it is in the device's format too (the model's float inputs are
            # where this is not already so: everything else comes from a rounded hand-off)
            with _outside_device():
                args, kwargs = map_tensors_keeping_types(
                    (args, kwargs), lambda t: round_to_precision(t, precision)
                )
            out = inner(*args, **kwargs)
            with _outside_device():
                return map_tensors_keeping_types(out, lambda t: round_to_precision(t, precision))

        return rounded


def leaf_modules(called: dict[str, int]) -> list[str]:
    """The called modules none of whose submodules were called, in call order."""
    names = [n for n in called if n != ROOT]
    return [n for n in names if not any(m.startswith(f"{n}.") for m in names)]


# -- the module tree ---------------------------------------------------------------------------

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def call_order(model: nn.Module, run: Callable[[], Any]) -> dict[str, int]:
    """Qualified names (root as ``root``) of the modules ``run()`` calls, by first call."""
    order: dict[str, int] = {}

    def pre(name: str, _m: nn.Module, _args: Any) -> None:
        order.setdefault(name, len(order))

    with on_calls(
        model, pre, modules=lambda _n, _m: True, with_kwargs=False, root_name=ROOT, errors="raise"
    ):
        run()
    return order


def child_units(model: nn.Module, name: str, called: dict[str, int]) -> list[str]:
    """The called children of ``name`` in call order, containers opened into their members."""
    module = model.get_submodule(module_path(name))
    prefix = "" if name == ROOT else f"{name}."
    units: list[str] = []

    def walk(mod: nn.Module, at: str) -> None:
        for child_name, child in mod.named_children():
            qualified = f"{at}{child_name}"
            if isinstance(child, _CONTAINERS):
                walk(child, f"{qualified}.")
            elif qualified in called:
                units.append(qualified)
            elif any(n.startswith(f"{qualified}.") for n in called):
                # a module only used as a namespace (GPT-2's ``transformer``, whose parent
                # calls ``transformer.h[i]`` directly): its forward never runs, so it cannot
                # be swapped; its called members are the units, as a container's are
                walk(child, f"{qualified}.")

    walk(module, prefix)
    return sorted(units, key=called.__getitem__)


# -- the search --------------------------------------------------------------------------------


class Bisector:
    """Find the culprits with ``probe(names) -> {output: error}`` over the module tree of ``model``.

    ``probe`` runs the device forward with ``names`` at reference precision and returns
    the error of each output; a probe passes when every output is within its own
    ``thresholds`` entry. ``called`` maps the modules a forward calls to their call order.
    ``on_probe`` sees every probe as it completes.
    """

    def __init__(
        self,
        model: nn.Module,
        probe: Callable[[list[str]], dict[str, float]],
        called: dict[str, int],
        thresholds: dict[str, float],
        on_probe: Callable[[Probe], None] | None = None,
    ) -> None:
        self.model = model
        self._probe = probe
        self.called = called
        self.thresholds = thresholds
        self.on_probe = on_probe
        self.probes: list[Probe] = []
        #: each probe by the set it tested (its error and whether it passed, run once)
        self._cache: dict[frozenset[str], Probe] = {}

    def _run(self, names: Sequence[str]) -> Probe:
        key = frozenset(names)
        if key not in self._cache:
            ordered = sorted(key, key=lambda n: self.called.get(n, -1))
            found = self._probe(ordered)
            passed = all(
                math.isfinite(e) and e <= self.thresholds.get(k, math.inf) for k, e in found.items()
            )
            probe = Probe(
                index=len(self.probes),
                at_reference=ordered,
                error=worst(found),
                passed=passed,
                outputs=found,
            )
            self.probes.append(probe)
            self._cache[key] = probe
            if self.on_probe is not None:
                self.on_probe(probe)
        return self._cache[key]

    def error(self, names: Sequence[str]) -> float:
        """The output error (the worst output) with ``names`` at reference (cached by the set)."""
        return self._run(names).error

    def passes(self, names: Sequence[str]) -> bool:
        """True when every output with ``names`` at reference is within its threshold."""
        return self._run(names).passed

    def _quickxplain(self, background: list[str], delta: bool, units: list[str]) -> list[str]:
        """A minimal subset X of ``units`` passing with ``background`` (Junker's QuickXplain)."""
        if delta and self.passes(background):
            return []
        if len(units) == 1:
            return list(units)
        half = len(units) // 2
        first, second = units[:half], units[half:]
        found_second = self._quickxplain(background + first, bool(first), second)
        found_first = self._quickxplain(background + found_second, bool(found_second), first)
        return found_first + found_second

    def minimal(self, background: list[str], units: list[str]) -> list[str] | None:
        """A minimal subset of ``units`` that passes with ``background``; None if all do not."""
        if not units or not self.passes(background + units):
            return None
        return self._quickxplain(list(background), False, list(units))

    def run(self) -> list[str]:
        """The minimal set of culprits (empty when the device output already passes)."""
        if self.passes([]):
            return []
        top = child_units(self.model, ROOT, self.called)
        found = self.minimal([], top)
        if found is None:  # the root's own code (outside every child) is needed
            if not self.passes([ROOT]):
                raise TargetError(
                    "even with the whole model at reference precision the output error is "
                    f"{self.error([ROOT]):.3g} (threshold {min(self.thresholds.values()):.3g}): "
                    "the forward does not reproduce the reference (random ops or state it "
                    "changes), so there is nothing to bisect"
                )
            return [ROOT]
        final: list[str] = []
        queue = list(found)
        while queue:
            culprit = queue.pop(0)
            children = child_units(self.model, culprit, self.called)
            refined = self.minimal(final + queue, children) if children else None
            if refined is None:
                final.append(culprit)  # a leaf, or its own code needs the reference
            else:
                queue = refined + queue
        # linear pass: drop each culprit the others can do without
        for culprit in list(final):
            rest = [c for c in final if c != culprit]
            if rest and self.passes(rest):
                final = rest
        return sorted(final, key=lambda n: self.called.get(n, -1))


# -- the command's engine ----------------------------------------------------------------------


def bisect(
    target: str | Target | Side,
    *,
    golden: Side | None = None,
    device: str | None = None,
    reference: str | None = None,
    dtype: str | torch.dtype | None = None,
    reference_dtype: str | torch.dtype | None = None,
    metric: str = "rel_l2",
    threshold: float | None = None,
    step: int = 0,
    on_probe: Callable[[Probe], None] | None = None,
    prepare: Callable[[nn.Module], Any] | None = None,
) -> BisectResult:
    """Bisect the modules of ``target`` that make its output on ``device`` differ.

    ``target`` is the actual side, a :class:`~precguard.Side` (the one way:
    ``bisect(Side("tiny-llama", "emu:bf16"), golden=Side("tiny-llama", "cuda"))``), or
    a target spec with the side's ``device`` (then required), ``dtype`` and ``prepare``
    as keywords. ``golden`` is the reference: a Side of the same target (its device and
    dtype; default: the CPU in float32). The deprecated keywords ``reference=`` (the
    golden's device) and ``reference_dtype=`` (its dtype, default float32) build it;
    either beside ``golden=`` is a usage error (:func:`~precguard.target_run.golden_side`).

    The model is built once from the target's seed; one copy runs on the golden's
    device in its dtype, the other on the actual's (its dtype None: float32, or the
    storage dtype of a mixed-precision ``emu:`` profile). Batch ``step`` is the input.
    ``threshold`` defaults, for ``rel_l2``, to a threshold per floating output derived
    from the floor probe (:data:`CORRECT_RUN_GROWTH`: what a correct device run of this
    model explains), and must be given for any other metric. The actual Side's
    ``prepare(model)`` alters the built model before it is copied, so both sides carry it
    (tests plant faults with it).
    """
    if metric not in METRICS:
        from precguard.suggest import did_you_mean

        raise UsageError(
            f"unknown metric {metric!r}{did_you_mean(metric, METRICS, n=1)}; "
            f"expected one of: {', '.join(METRICS)}"
        )
    if threshold is not None and not (threshold >= 0 and math.isfinite(threshold)):
        raise UsageError(f"--threshold must be a finite number >= 0, got {threshold}")
    side = one_side(
        target, "bisect", device=device, dtype=dtype, prepare=prepare, default_device=None
    )
    golden = golden_side(
        golden, side, "bisect", reference=reference, reference_dtype=reference_dtype
    )
    run = side.open()
    target_obj, backend, model_dtype = run.target, run.backend, run.dtype
    # the reference is one object (its device, backend and dtype), the same loaded target
    reference_run = golden.open_beside(run)
    ref_backend = reference_run.backend
    compute = backend.compute_dtype() or model_dtype
    if threshold is None and metric != "rel_l2":
        raise UsageError(f"--metric {metric} needs --threshold (a default exists for rel_l2)")
    # the format a correct device stores each hand-off in: the less precise of what it
    # computes in and what the model is stored in
    storage = max(compute, model_dtype, key=precision_eps)

    twins = Twins(run, reference_run, step=step)
    model, reference_model, dev_batch = twins.model, twins.reference_model, twins.device_batch
    reference_forward, user_code = twins.forward_reference, run.call

    expected = floating_outputs(user_code("the reference forward", reference_forward), "reference")
    for name, tensor in expected.items():
        if not bool(torch.isfinite(tensor).all()):
            raise TargetError(
                f"target {target_obj.name!r}: the reference output {name} on {golden.device} is "
                "not finite; there is nothing trustworthy to bisect against (a bug that "
                "shows at reference precision too is not bisect's: see op-check)"
            )
    expected = {k: v.detach().to("cpu", torch.float64) for k, v in expected.items()}
    called = call_order(reference_model, reference_forward)

    def probe(names: list[str], floor: bool = False) -> dict[str, float]:
        swap = (
            RoundedReference(
                model,
                reference_model,
                names,
                ref_backend,
                reference_run.dtype,
                precision=storage,
            )
            if floor
            else ReferencePrecision(model, reference_model, names, ref_backend, reference_run.dtype)
        )

        out = user_code(
            "the device forward", lambda: forward_once(backend, model, dev_batch, [swap])
        )
        out = floating_outputs(out, "device")
        if out.keys() != expected.keys():
            raise TargetError(
                f"the device forward returned the outputs {', '.join(out)}, the reference "
                f"{', '.join(expected)}: they cannot be compared"
            )
        return {k: output_error(out[k], expected[k], metric) for k in expected}

    floors: dict[str, float] = {}
    if threshold is None:
        # the floor is a measurement of this forward: it means something only when the
        # forward reproduces the reference (no random ops, no state it changes)
        # (an infinite error is the format's range, which the search reports as an overflow)
        again = probe([ROOT])
        for k, err in again.items():
            if math.isfinite(err) and err > least_threshold(storage, _length(expected[k])):
                raise TargetError(
                    f"even with the whole model at reference precision the output {k} has "
                    f"error {err:.3g}: the forward does not reproduce the reference (random "
                    "ops or state it changes), so there is nothing to bisect"
                )
        floors = probe(leaf_modules(called), floor=True)
        thresholds = {
            k: correct_threshold(floors[k], storage, _length(expected[k])) for k in expected
        }
    else:
        thresholds = dict.fromkeys(expected, threshold)
    bisector = Bisector(model, probe, called, thresholds, on_probe)
    overflow: Overflow | None = None
    note: str | None = None
    if not math.isfinite(bisector.error([])):

        def device_forward() -> Any:
            with torch.no_grad(), backend.numerics():
                return call_model(model, dev_batch)

        overflow = user_code(
            "the device forward",
            lambda: find_overflow(
                model, device_forward, overflow_format(compute), reference_model, reference_forward
            ),
        )
    try:
        culprits = bisector.run()
    except TargetError:
        if overflow is None:
            raise
        culprits = []
        note = (
            "no set of modules at reference precision fixes the output: with the whole model "
            f"at reference its output error is still {bisector.error([ROOT]):.3g}, so values "
            f"beyond {dtype_name(overflow_format(compute))}'s range reach the output; rescale them "
            f"(from {overflow.module} on) or keep them in a wider dtype"
        )
    probes = bisector.probes
    baseline = probes[0].error
    fixed = bisector.error(culprits) if culprits else baseline
    # the threshold shown beside the baseline: that of the output furthest beyond its own
    decisive = max(
        probes[0].outputs or thresholds,
        key=lambda k: _ratio(probes[0].outputs.get(k, 0.0), thresholds[k]),
    )
    logger.info("bisect_done", culprits=culprits, probes=len(probes))
    return BisectResult(
        target=target_obj.name,
        device=side.device,
        dtype=dtype_name(model_dtype),
        reference=golden.device,
        reference_dtype=dtype_name(reference_run.dtype),
        metric=metric,
        threshold=thresholds[decisive],
        thresholds=thresholds,
        floor_errors=floors,
        culprits=culprits,
        probes=list(bisector.probes),
        probe_count=len(bisector.probes),
        units=len(child_units(model, ROOT, called)),
        baseline_error=baseline,
        output_errors=dict(probes[0].outputs),
        fixed_error=fixed,
        overflow=overflow,
        note=note,
    )


def overflow_format(compute: torch.dtype | str) -> torch.dtype:
    """The storage format whose range a compute precision has (TF32/HF32: float32's)."""
    return compute if isinstance(compute, torch.dtype) else torch.float32


def find_overflow(
    model: nn.Module,
    forward: Callable[[], Any],
    fmt: torch.dtype,
    reference_model: nn.Module | None = None,
    reference_forward: Callable[[], Any] | None = None,
) -> Overflow | None:
    """The first module (in completion order) whose output leaves ``fmt``'s range.

    Runs ``forward()`` once with hooks on every module of ``model``: an output
    leaves the range when it holds NaN/Inf or an element at ±max (saturation)
    while the module's inputs held neither. The hooks' own reductions run
    outside the device's numerics and cost three host syncs per float tensor; this is a
    diagnosis run, not capture. With ``reference_model`` the same module's
    output is measured on the reference (``reference_forward()``) too.
    """
    fmax = float(torch.finfo(fmt).max)
    found: list[tuple[str, nn.Module, dict[str, float]]] = []
    origin = NonFiniteOrigin()  # saturation counts as non-finite here: out of fmt's range
    inputs_ok: dict[str, tuple[bool, float]] = {}

    def measure(value: Any) -> tuple[int, int, float]:
        nonfinite = saturated = 0
        absmax = 0.0
        for t in _float_tensors(value):
            with _outside_device():
                x = t.detach()
                finite = torch.isfinite(x)
                nonfinite += int((~finite).sum())
                mags = torch.where(finite, x.abs(), torch.zeros((), dtype=x.dtype))
                top = float(mags.max()) if x.numel() else 0.0
                saturated += int((mags >= fmax).sum())
            absmax = max(absmax, top)
        return nonfinite, saturated, absmax

    def pre(name: str, _m: nn.Module, args: Any, kwargs: Any) -> None:
        if not found:
            nonfinite, saturated, absmax = measure((args, kwargs))
            inputs_ok[name] = (nonfinite == 0 and saturated == 0, absmax)

    def post(name: str, module: nn.Module, _args: Any, _kwargs: Any, output: Any) -> None:
        ok, in_absmax = inputs_ok.get(name, (False, math.inf))
        if found or not ok:
            return
        nonfinite, saturated, absmax = measure(output)
        if origin.call(name, ok, not (nonfinite or saturated)):
            values = {"nonfinite": nonfinite, "saturated": saturated, "absmax": absmax}
            found.append((name, module, {**values, "in": in_absmax}))

    # a measurement that failed would name no module or the wrong one: raised
    with on_calls(model, pre, post, modules=lambda _n, _m: True, root_name=ROOT, errors="raise"):
        forward()
    if not found:
        return None
    name, module, values = found[0]
    reference_absmax = None
    if reference_model is not None and reference_forward is not None:
        reference_absmax = _reference_absmax(reference_model, name, reference_forward)
    return Overflow(
        module=name,
        module_type=type(module).__name__,
        format=dtype_name(fmt),
        format_max=fmax,
        nonfinite=int(values["nonfinite"]),
        saturated=int(values["saturated"]),
        device_absmax=values["absmax"],
        input_absmax=values["in"],
        reference_absmax=reference_absmax,
    )


def _reference_absmax(model: nn.Module, name: str, forward: Callable[[], Any]) -> float | None:
    """Largest |value| of module ``name``'s output in one ``forward()`` of ``model``."""
    seen: list[float] = []

    def hook(_name: str, _m: nn.Module, _args: Any, output: Any) -> None:
        if not seen:
            tops = [float(t.detach().abs().max()) for t in _float_tensors(output) if t.numel()]
            seen.append(max(tops, default=0.0))

    try:
        module = model.get_submodule(module_path(name))
    except AttributeError:
        return None
    with on_calls(module, post=hook, modules=["root"], with_kwargs=False, errors="raise"):
        forward()
    return seen[0] if seen else None


def _float_tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree.tensors(value) if t.is_floating_point()]


def _length(t: torch.Tensor) -> int | None:
    """The last dimension of an output (None for a scalar loss)."""
    return int(t.shape[-1]) if t.dim() else None


def _ratio(err: float, threshold: float) -> float:
    if math.isnan(err) or math.isinf(err):
        return math.inf
    return err / threshold if threshold > 0 else (math.inf if err > 0 else 0.0)


def _cast_batch(batch: Any, dtype: torch.dtype) -> Any:
    return map_tensors_keeping_types(batch, lambda t: t.to(dtype) if t.is_floating_point() else t)


def floating_outputs(output: Any, where: str) -> dict[str, torch.Tensor]:
    """Every floating tensor of a model's output by its path, as HF returns outputs.

    A lone tensor is ``output``; a ``(loss, logits)`` tuple (HF's ``return_dict=False``)
    ``output.0`` and ``output.1``; a ``ModelOutput`` or dict ``output.loss``,
    ``output.logits``. All are judged: the first floating output of a model that
    computes its own loss is the loss, a mean over every token, which averages out
    an error its logits show.
    """
    found = {name: t for name, t in tree.named_tensors(output, "output") if t.is_floating_point()}
    if not found:
        raise TargetError(
            f"the model's {where} output ({type(output).__name__}) holds no floating tensor "
            "to measure"
        )
    return found


def main_output(output: Any, where: str) -> torch.Tensor:
    """The output users read: its logits (by name, else the largest floating tensor).

    A ``(loss, logits)`` tuple's first tensor is the loss, a mean that averages out
    what its logits show: the largest tensor is the logits there.
    """
    found = floating_outputs(output, where)
    for name, t in found.items():
        if name.rsplit(".", 1)[-1] == "logits":
            return t
    return max(found.values(), key=lambda t: t.numel())


def worst(errors: dict[str, float]) -> float:
    """The largest of per-output errors (NaN counts as infinite; no outputs: 0)."""
    values = [math.inf if math.isnan(e) else e for e in errors.values()]
    return max(values, default=0.0)
