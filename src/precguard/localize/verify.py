"""Remedies verified by re-running: each mechanical fix applied to the actual side, measured.

A finding's remedy is advice until the numbers move. For each local module of
an error budget (:mod:`precguard.localize.impact`), the remedies that can be
applied without the user's hands are applied to the actual side's model and
its output error measured again:

``reference-precision``
    the module computed at reference precision (as ``bisect`` runs it);
``float32-compute``
    the module computed in float32 on the actual's own device, its output
    rounded back: a norm's statistics in float32, rotary frequencies and
    angles in float32, or any module upcast;
``float32-buffers``
    the module's floating buffers (``inv_freq``) kept at the float32 values
    the model was built with, where a cast (``model.to(bfloat16)``) rounded them;
``float32-loss``
    the target's loss computed on float32 logits (the loss's own error);
``switch:NAME``
    a device setting a plugin declares (``precguard_register_switches``):
    another ``emu:`` profile, a vendor flag; run on the whole model.

Each result is judged against the floor of a correct run at the actual
precision (:meth:`~precguard.localize.impact.ActualSide.floor`): *verified*
when the error falls to within :data:`~precguard.numerics.FLOOR_SLACK` of it,
*not needed* when it was within it already, *did not help* when it removes
under :data:`~precguard.numerics.HELP_SHARE` of the excess over it, else
*partial*. The remedies are those of
:func:`precguard.compare.advice.candidates`, in its order (the smallest change
first), and :func:`~precguard.compare.advice.chosen` names the one compare prints.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from precguard import tree
from precguard._logging import get_logger
from precguard.backend import Switch
from precguard.capture.hooks import replace_forward
from precguard.compare import advice
from precguard.compare.impact_report import ErrorBudget, Impact, RemedyCheck
from precguard.compare.report import Comparison
from precguard.devices import dtype_name
from precguard.errors import PrecguardError, UsageError
from precguard.localize.bisect import (
    ROOT,
    ReferencePrecision,
    _cast_batch,
    forward_once,
    main_output,
    module_path,
)
from precguard.localize.bisect import _outside_device as bisect_outside_device
from precguard.localize.impact import (
    ActualSide,
    comparison_findings,
    comparison_impact,
    comparison_sides,
    comparison_step,
    error_budget,
    not_run,
    opcheck_findings,
    relative_error,
    remedy_check,
)
from precguard.opcheck.sweep import OpCheckResult
from precguard.oracle import map_tensors_keeping_types
from precguard.target_run import Side, TargetRun, golden_side, spec_name

if TYPE_CHECKING:
    from precguard.checkspec import Finding

logger = get_logger(__name__)


def _kind(module: nn.Module) -> str:
    return advice.kind(type(module).__name__)


@contextlib.contextmanager
def _buffers_kept(module: nn.Module, values: dict[str, torch.Tensor]) -> Iterator[None]:
    """``module``'s named buffers replaced by ``values`` for a while, then restored."""
    saved: list[tuple[nn.Module, str, torch.Tensor | None]] = []
    try:
        for name, value in values.items():
            owner_path, _, leaf = name.rpartition(".")
            owner = module.get_submodule(owner_path) if owner_path else module
            saved.append((owner, leaf, owner._buffers[leaf]))
            owner._buffers[leaf] = value
        yield
    finally:
        for owner, leaf, old in reversed(saved):
            owner._buffers[leaf] = old


def _rounded_buffers(side: ActualSide, name: str) -> dict[str, torch.Tensor]:
    """The floating buffers of module ``name`` a cast rounded, at their built float32 values."""
    path = module_path(name)
    now = side.model.get_submodule(path)
    built = dict(side.constructed.get_submodule(path).named_buffers())
    found: dict[str, torch.Tensor] = {}
    for buf_name, buf in now.named_buffers():
        original = built.get(buf_name)
        if (
            original is not None
            and buf.is_floating_point()
            and original.is_floating_point()
            and buf.dtype != original.dtype
            and torch.finfo(buf.dtype).eps > torch.finfo(original.dtype).eps
        ):
            found[buf_name] = original.to(buf.device)
    return found


def module_remedies(
    side: ActualSide, impact: Impact, floor: float | None, float32_twin: nn.Module
) -> list[RemedyCheck]:
    """Each mechanical remedy of ``impact``'s module applied to the actual side, measured."""
    name = impact.module
    before = impact.before
    if before is None or not side.has_module(name):
        return []
    module = side.model.get_submodule(module_path(name))
    kind = _kind(module)
    if kind == "loss":  # the logits do not show a loss's error: judged on the loss itself
        return [loss_module_remedy(side, name, float32_twin)]
    checks: list[RemedyCheck] = []

    def result(remedy: str, summary: str, after: float, note: str = "") -> RemedyCheck:
        assert before is not None
        return remedy_check(remedy, summary, before, after, floor, note)

    # the candidates compare prints, in their order (compare/advice.py): one source of advice
    buffers = _rounded_buffers(side, name)
    if buffers:
        built = dtype_name(next(iter(buffers.values())).dtype)
        text = advice.buffers_text(buffers, built, dtype_name(side.run.dtype))
        after = side.output_error(
            changes=[lambda model: _buffers_kept(model.get_submodule(module_path(name)), buffers)]
        )
        checks.append(result("float32-buffers", f"{name}: {text}", after))
    backend = side.run.backend
    label = f"{name}: {advice.compute_text(name, type(module).__name__)}"
    try:
        after = side.output_error(
            changes=[
                lambda model: ReferencePrecision(
                    model, float32_twin, [name], backend, torch.float32
                )
            ]
        )
        checks.append(result("float32-compute", label, after))
    except PrecguardError as exc:
        checks.append(not_run("float32-compute", label, str(exc), before, floor))
    if impact.after is not None:
        text = f"run {name} at reference precision ({dtype_name(side.golden.dtype)})"
        checks.append(result("reference-precision", text, impact.after))
    return checks


def switch_remedies(side: ActualSide, floor: float | None) -> list[RemedyCheck]:
    """Each switch a plugin declares for the actual's device, run on the whole model."""
    from precguard.plugins import collect_switches

    before = side.output_error()
    checks: list[RemedyCheck] = []
    for switch in collect_switches(side.run.device):
        summary = f"{switch.summary} ({switch.name})"
        try:
            after = _switched_error(side, switch)
        except PrecguardError as exc:
            checks.append(not_run(f"switch:{switch.name}", summary, str(exc), before, floor))
            continue
        where = f": run on {switch.instead}" if switch.instead else ""
        checks.append(remedy_check(f"switch:{switch.name}", summary + where, before, after, floor))
    return checks


def _switched_error(side: ActualSide, switch: Switch) -> float:
    """The output error of the whole actual side with ``switch`` set."""
    if switch.apply is not None:
        apply = switch.apply
        return side.output_error(changes=[lambda _model: apply()])
    assert switch.instead is not None
    run = TargetRun.on(side.run.target, switch.instead, *_backend_and_dtype(side, switch.instead))
    model = copy.deepcopy(side.constructed).to(device=run.torch_device, dtype=run.dtype)
    batch = _cast_batch(run.move(side.batch), run.dtype)
    out = run.call(
        f"the forward on {switch.instead}", lambda: forward_once(run.backend, model, batch)
    )
    return relative_error(main_output(out, "actual").detach().to("cpu"), side.expected)


def _backend_and_dtype(side: ActualSide, device: str) -> tuple[Any, torch.dtype]:
    """The switched device's backend, and the dtype ``record -d DEVICE`` would give it when
    the actual side ran in its own device's default (``emu:bf16`` keeps float32 tensors,
    ``emu:bf16-mixed`` stores bf16: run in float32 there it would round nothing)."""
    from precguard.devices import resolve_backend

    backend = resolve_backend(device)
    own_default = side.run.backend.model_dtype() or torch.float32
    if side.run.dtype == own_default:
        return backend, backend.model_dtype() or torch.float32
    return backend, side.run.dtype


@contextlib.contextmanager
def _loss_probe(
    model: nn.Module,
    name: str,
    compute: Callable[..., Any] | None,
    oracle: nn.Module,
    errors: list[float],
) -> Iterator[None]:
    """Module ``name`` of ``model`` computed by ``compute`` (None: as it is) on its own
    inputs, and the ``oracle`` (float64, on the CPU, outside the device's numerics) on the
    same inputs: the relative error of its first floating result is appended to ``errors``."""
    module = model.get_submodule(module_path(name))
    original = module.forward

    def forward(*args: Any, **kwargs: Any) -> Any:
        out = (compute or original)(*args, **kwargs)

        def exact(t: torch.Tensor) -> torch.Tensor:
            t = t.detach().to("cpu")
            return t.double() if t.is_floating_point() else t

        with bisect_outside_device():
            want = oracle(
                *map_tensors_keeping_types(args, exact), **map_tensors_keeping_types(kwargs, exact)
            )
        got_t, want_t = tree.first_tensor(out), tree.first_tensor(want)
        if got_t is not None and want_t is not None and not errors:
            errors.append(relative_error(got_t.detach().to("cpu").double(), want_t))
        return out

    with replace_forward(module, forward):
        yield


def _on_float32(module: nn.Module, device: torch.device, *, outside: bool) -> Callable[..., Any]:
    """``module`` called on ``device`` with its floating inputs in float32, its result kept
    (a loss is not rounded back to the logits' dtype); ``outside``: out of the device's
    numerics (a computation of the reference)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        def up(t: torch.Tensor) -> torch.Tensor:
            t = t.to(device)
            return t.float() if t.is_floating_point() else t

        with bisect_outside_device() if outside else contextlib.nullcontext():
            return module(
                *map_tensors_keeping_types(args, up), **map_tensors_keeping_types(kwargs, up)
            )

    return call


def loss_module_remedy(side: ActualSide, name: str, float32_twin: nn.Module) -> RemedyCheck:
    """The loss module ``name`` computed on float32 logits, judged on the loss itself.

    The logits do not show a loss's error, and the loss of logits that carry the
    device's rounding differs from the reference's loss by that rounding whatever the
    loss does. So the loss is judged *on its own inputs*: its result against the same
    loss computed in float64 from the same logits (on the CPU). *before*: the module as
    the device computes it; *after*: the module on float32 logits on the device (its
    float32 result kept, as a correct loss returns it); *floor*: a correct loss kernel,
    float32 logits in and float32 accumulation, on the reference device.
    """
    summary = f"{name}: the loss computed on float32 logits"
    path = module_path(name)
    oracle = copy.deepcopy(side.constructed.get_submodule(path)).to(torch.float64)
    reference = copy.deepcopy(side.constructed.get_submodule(path))
    twin = float32_twin.get_submodule(path)
    device = side.run.torch_device

    def measured(compute: Callable[..., Any] | None) -> float:
        errors: list[float] = []
        side.forward([lambda model: _loss_probe(model, name, compute, oracle, errors)])
        if not errors:
            raise PrecguardError(f"{name} was not called with a floating input by the forward")
        return errors[0]

    try:
        before = measured(None)
        after = measured(_on_float32(twin, device, outside=False))
        floor = measured(_on_float32(reference, torch.device("cpu"), outside=True))
    except PrecguardError as exc:
        return not_run("float32-loss", summary, str(exc))
    note = "the loss's relative error on the device's own logits (the logits do not show it)"
    return remedy_check("float32-loss", summary, before, after, floor, note)


def loss_remedy(side: ActualSide) -> RemedyCheck:
    """The target's loss on float32 logits, against its loss as the actual side computes it.

    The error is the loss's relative error against the reference's loss; the floor is
    that of a correct run, which computes its loss on float32 logits: the remedy's own
    result, so the check says whether the loss's precision is the cause, by how much.
    """
    target = side.run.target
    summary = "the loss computed on float32 logits"
    if target.loss is None:
        return not_run("float32-loss", summary, "the target has no loss")
    loss = target.loss
    reference_out = side.run.call("the reference forward", side.forward_reference)
    expected = side.run.call("the loss", lambda: loss(reference_out, side.reference_batch)).detach()

    def error(logits: Any) -> float:
        got = side.run.call("the loss", lambda: loss(logits, side.device_batch)).detach()
        return relative_error(got.to("cpu"), expected.to("cpu"))

    out = side.forward()
    before, after = error(out), error(_float32_logits(out))
    return remedy_check(
        "float32-loss",
        summary,
        before,
        after,
        after,
        "the loss's relative error; a correct run computes it on float32 logits",
    )


def _float32_logits(output: Any) -> Any:
    if isinstance(output, torch.Tensor):
        return output.float()
    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        upcast = copy.copy(output)
        upcast["logits"] = logits.float()
        return upcast
    return output


def verify_remedies(side: ActualSide, budget: ErrorBudget, *, loss: bool = False) -> ErrorBudget:
    """``budget`` with each finding's remedies applied and measured, and the device switches.

    ``loss`` also verifies the float32-loss remedy (a finding about the loss).
    """
    float32_twin = copy.deepcopy(side.constructed).to(device=side.run.torch_device)
    impacts = [
        impact.model_copy(
            update={"remedies": module_remedies(side, impact, budget.floor, float32_twin)}
        )
        for impact in budget.impacts
    ]
    modules = loss_modules(side) if loss else []
    for name in modules:  # the model computes its loss itself: that module is the finding's
        if name not in {i.module for i in impacts}:
            impacts.append(
                Impact(
                    module=name,
                    found_by=["loss"],
                    note="the loss's own error (the logits do not show it)",
                    remedies=[loss_module_remedy(side, name, float32_twin)],
                )
            )
    if loss and not modules:
        check = loss_remedy(side)
        impacts.append(
            Impact(
                module="loss",
                found_by=["loss"],
                before=check.before,
                note="the loss's own error (not the logits')",
                remedies=[check],
            )
        )
    switches = switch_remedies(side, budget.floor)
    logger.info("remedies_verified", findings=len(impacts), switches=len(switches))
    return budget.model_copy(update={"impacts": impacts, "switches": switches})


#: what separates a module name from the words around it in a finding's evidence
_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*")


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():  # keys name every module a check looked at, not findings
            yield from _strings(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _strings(item)


def finding_modules(side: ActualSide, evidence: dict[str, Any]) -> list[str]:
    """The target's modules a check's evidence names (its values: ``module``, ``failures``),
    each module's ancestors left out (``model`` beside ``model.rotary_emb``)."""
    found: list[str] = []
    for text in _strings(evidence):
        for word in _WORD.findall(text):
            name = word.rstrip(".")
            if name not in found and name != ROOT and side.has_module(name):
                found.append(name)
    return [n for n in found if not any(o.startswith(n + ".") for o in found)]


def loss_modules(side: ActualSide) -> list[str]:
    """The modules of the target's model that compute a loss (a class named ``*Loss*``)."""
    return [name for name, module in side.model.named_modules() if name and _kind(module) == "loss"]


def verify(
    source: Comparison | OpCheckResult | Sequence[Finding],
    side: Side,
    *,
    golden: Side | None = None,
    remedies: bool = True,
    step: int = 0,
) -> Any:
    """Re-run ``side`` (the actual :class:`~precguard.Side`) to measure each finding's share
    of the output error and, with ``remedies``, re-run its remedies (compare/advice.py's
    candidates, in their order) and the device switches: the one entry point of
    ``compare --target/--verify``, ``check --verify`` and ``op-check --verify``.

    ``source`` says what the findings are:

    * a :class:`~precguard.Comparison`: its local forward findings; returns the comparison
      with ``impact`` set and its first divergence's chosen ``remedy``. ``golden`` defaults
      to the golden recording's device and dtype (:func:`comparison_sides`);
    * an ``op-check --module`` result: the modules the sweep failed; returns an ErrorBudget;
    * a checklist's findings (a Diagnosis' ``root_causes``): the modules their evidence
      names (and the loss); returns an ErrorBudget, on batch ``step``.

    ``golden`` is the reference Side (default: the CPU in float32, or the recording's).

    >>> result = precguard.compare_runs("runs/cpu", "runs/bf16")              # doctest: +SKIP
    >>> golden, actual = comparison_sides(result, "model.py")                 # doctest: +SKIP
    >>> checked = verify(result, actual, golden=golden)                       # doctest: +SKIP
    >>> checked.first_divergence.remedy.describe()                            # doctest: +SKIP
    'model.rotary_emb: compute the rotary frequencies and angles in float32: verified: ...'
    """
    if not isinstance(side, Side):
        raise UsageError(
            f"verify takes the actual side as a precguard.Side, got {type(side).__name__} "
            "(Side(target, device, dtype); comparison_sides builds both from a comparison)"
        )
    if isinstance(source, Comparison):
        g, a = comparison_sides(source, side, golden=golden, what="verify")
        return _comparison(source, a, g, remedies)
    reference = golden_side(golden, side, "verify")
    if isinstance(source, OpCheckResult):
        return _opcheck(source, side, reference, remedies)
    return _findings(list(source), side, reference, step)


def _findings(findings: Sequence[Finding], actual: Side, golden: Side, step: int) -> ErrorBudget:
    """The checklist's flagged ``findings`` (fail or warn) as an error budget with verified
    remedies: each module their evidence names, and the float32 loss for a loss finding."""
    flagged = [f for f in findings if f.status in ("fail", "warn")]
    side = ActualSide.open(actual, golden=golden, step=step)
    named = [(m, f.id) for f in flagged for m in finding_modules(side, f.evidence)]
    loss_findings = [f for f in flagged if f.family == "loss"]
    # a model that computes its loss itself (a loss module, HF's ``(loss, logits)``): the
    # loss finding is that module's, judged on its own inputs; else the target's loss
    modules = loss_modules(side) if loss_findings else []
    named += [(m, f.id) for f in loss_findings for m in modules if (m, f.id) not in named]
    loss = bool(loss_findings) and not modules
    budget = (
        error_budget(side, named)
        if named
        else ErrorBudget(
            measured="target",
            target=side.run.name,
            device=side.run.device,
            output_error=side.output_error(),
            note="no flagged finding names a module of the target",
        )
    )
    return verify_remedies(side, budget, loss=loss)


def _opcheck(result: OpCheckResult, actual: Side, golden: Side, remedies: bool) -> ErrorBudget:
    """The error budget of an ``op-check --target T --module M`` sweep's failed module: its
    share of the model's output error, and with ``remedies`` its remedies re-run. The sweep
    judges the module on its own inputs; whether that reaches the output is the re-run's."""
    findings = opcheck_findings(result)
    if not findings:
        return ErrorBudget(
            measured="target",
            target=spec_name(actual),
            device=actual.device,
            note="no module of the target failed the sweep: nothing to measure",
        )
    side = ActualSide.open(actual, golden=golden)
    budget = error_budget(side, findings)
    return verify_remedies(side, budget) if remedies else budget


def _comparison(result: Comparison, actual: Side, golden: Side, remedies: bool) -> Comparison:
    """``result`` with its error budget measured by re-running ``actual`` beside ``golden``,
    and with ``remedies`` each finding's remedies and the device switches; an error of the
    re-run leaves the comparison standing with a note."""
    findings, _ = comparison_findings(result)
    if not findings:
        return result.model_copy(update={"impact": comparison_impact(result, actual)})
    try:
        side = ActualSide.open(actual, golden=golden, step=comparison_step(result))
        budget = comparison_impact(result, actual, side=side)
        if remedies:
            loss = any(
                "loss" in module.lower() and not side.has_module(module) for module, _ in findings
            )
            budget = verify_remedies(side, budget, loss=loss)
    except PrecguardError as exc:  # the comparison stands; say why its impact is missing
        logger.warning("impact_not_measured", error=str(exc))
        budget = ErrorBudget(
            measured="target",
            target=spec_name(actual),
            note=f"impact not measured: {exc}",
        )
    return with_chosen_remedy(result.model_copy(update={"impact": budget}))


def with_chosen_remedy(result: Comparison) -> Comparison:
    """``result`` with its first divergence's remedy set to the one verification chose
    (:func:`precguard.compare.advice.chosen`), when its remedies were re-run."""
    first, budget = result.first_divergence, result.impact
    if first is None or budget is None:
        return result
    checks = [c for i in budget.impacts if i.module == first.module for c in i.remedies]
    pick = advice.chosen(checks)
    if pick is None:
        return result
    return result.model_copy(update={"first_divergence": first.model_copy(update={"remedy": pick})})


__all__ = [
    "finding_modules",
    "loss_module_remedy",
    "loss_modules",
    "loss_remedy",
    "module_remedies",
    "switch_remedies",
    "verify",
    "verify_remedies",
    "with_chosen_remedy",
]
