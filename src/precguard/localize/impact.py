"""Impact: how much of the model's output error each local finding accounts for.

compare, replay, bisect and the checklist each name modules that make error
of their own. Whether that matters is a counterfactual: the model's output
error with that one module computed at reference precision, against the
output error as the actual side computes it. This module runs it.

The target is built once from its seed (as ``bisect`` builds it): one copy
on the golden :class:`~precguard.Side` (its device and dtype, e.g. the CPU in
float32) gives the output the errors are measured against, the other runs on
the actual Side's device in its dtype. A module is put at reference precision the way
``bisect`` does it (:class:`~precguard.localize.bisect.ReferencePrecision`:
its call goes to the same module of the reference copy, its output cast back
to the actual's dtype), so no second hook layer exists. The error is the
relative L2 error of the logits, measured by :func:`precguard.numerics.measure`,
whose sums are compare's (:func:`precguard.difference.accumulate`): the re-run
reproduces the recorded comparison's error bit for bit.

A module's *share* is ``(before - after) / before``. The error budget lists
each local module's share, the error with all of them at reference together,
and the share no single module explains (``1 -`` the sum of the positive
shares). Its *floor* is the output error of a correct run at the actual
precision (:meth:`ActualSide.floor`, docs/impact.md).

>>> side = ActualSide.open(Side("tiny-llama", "emu:bf16-mixed"))      # doctest: +SKIP
>>> budget = error_budget(side, ["model.rotary_emb"])                  # doctest: +SKIP
>>> budget.impacts[0].describe()                                       # doctest: +SKIP
'model.rotary_emb: output error 0.0240 -> 0.0238 with it at reference precision (1% ...)'
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from precguard._logging import get_logger
from precguard.compare.findings import comparison_findings, recordings_only
from precguard.compare.impact_report import (
    ErrorBudget,
    Impact,
    RemedyCheck,
    judge_remedy,
)
from precguard.compare.metrics import exact_metrics
from precguard.compare.report import Comparison
from precguard.devices import dtype_name, resolve_backend
from precguard.errors import PrecguardError, TargetError, UsageError
from precguard.localize.bisect import (
    ROOT,
    BisectResult,
    ReferencePrecision,
    Twins,
    forward_once,
    main_output,
    module_path,
)
from precguard.numerics import FLOOR_SLACK, HELP_SHARE, REPRODUCED, measure
from precguard.opcheck.sweep import OpCheckResult
from precguard.target import Target
from precguard.target_run import (
    Side,
    TargetRun,
    TargetSpec,
    golden_side,
    one_side,
    spec_name,
)

logger = get_logger(__name__)

#: a context applied around one forward of the actual side: (actual model) -> context manager
Change = Callable[[nn.Module], contextlib.AbstractContextManager[Any]]


class ActualSide(Twins):
    """The target built once: its actual side re-run with changes, its output error measured.

    :param run: the target set up on the actual's device and dtype.
    :param golden: the reference set up beside it (:meth:`~precguard.Side.open_beside`):
        the golden's device, backend and dtype, one object.
    :param step: the batch the forwards run on.

    Built as :class:`~precguard.localize.bisect.Twins` (``constructed`` kept).
    """

    def __init__(self, run: TargetRun, golden: TargetRun, *, step: int = 0) -> None:
        super().__init__(run, golden, step=step, keep_constructed=True)
        reference_out = run.call("the reference forward", self.forward_reference)
        self.expected = main_output(reference_out, "reference").detach().to("cpu")
        if not bool(torch.isfinite(self.expected).all()):
            raise TargetError(
                f"target {run.name!r}: the reference output is not finite; there is nothing "
                "trustworthy to measure against"
            )
        self._cache: dict[tuple[str, ...], float] = {}

    @classmethod
    def open(
        cls,
        target: str | Target | Side,
        *,
        golden: Side | None = None,
        device: str | None = None,
        dtype: str | torch.dtype | None = None,
        reference: str | None = None,
        reference_dtype: str | torch.dtype | None = None,
        step: int = 0,
        prepare: Callable[[nn.Module], Any] | None = None,
    ) -> ActualSide:
        """Build the actual side ``target`` and its ``golden`` (the reference) from one build.

        ``target`` is a :class:`~precguard.Side` (the one way: ``ActualSide.open(Side(
        "tiny-llama", "emu:bf16"), golden=Side("tiny-llama", "cuda"))``), or a target spec
        with the side's ``device`` (then required), ``dtype`` (None: as ``record`` would)
        and ``prepare`` as keywords. ``golden`` is a Side of the same target (default: the
        CPU in float32); the deprecated ``reference=``/``reference_dtype=`` build it.
        A keyword beside the Side it belongs to is a usage error.
        """
        side = one_side(
            target, "impact", device=device, dtype=dtype, prepare=prepare, default_device=None
        )
        golden = golden_side(
            golden, side, "impact", reference=reference, reference_dtype=reference_dtype
        )
        run = side.open()
        return cls(run, golden.open_beside(run), step=step)

    @property
    def reference_dtype(self) -> torch.dtype:
        """The golden's model dtype."""
        return self.golden.dtype

    # -- forwards ------------------------------------------------------------------------------

    def forward(self, changes: Sequence[Change] = ()) -> Any:
        """The actual side's output with ``changes`` applied around its forward."""
        return self.run.call(
            "the actual forward",
            lambda: forward_once(
                self.run.backend, self.model, self.device_batch, (c(self.model) for c in changes)
            ),
        )

    def at_reference(self, names: Sequence[str], twin: nn.Module | None = None) -> Change:
        """A change: ``names`` computed at reference precision (on ``twin``'s modules)."""
        reference_model = self.reference_model if twin is None else twin
        return lambda model: ReferencePrecision(
            model, reference_model, names, self.reference, self.reference_dtype
        )

    # -- errors ------------------------------------------------------------------------------

    def measure(self, output: Any) -> float:
        """The relative L2 error of ``output``'s logits against the reference's (inf if not
        finite), measured by :func:`precguard.numerics.measure`."""
        got = main_output(output, "actual").detach().to("cpu")
        return relative_error(got, self.expected)

    def output_error(
        self, at_reference: Sequence[str] = (), changes: Sequence[Change] = ()
    ) -> float:
        """The output error with ``at_reference`` modules at reference and ``changes`` applied
        (cached by the set of modules when there are no other changes)."""
        key = tuple(sorted(at_reference))
        if not changes and key in self._cache:
            return self._cache[key]
        all_changes = ([self.at_reference(list(at_reference))] if at_reference else []) + list(
            changes
        )
        err = self.measure(self.forward(all_changes))
        if not changes:
            self._cache[key] = err
        return err

    def has_module(self, name: str) -> bool:
        """True when ``name`` is a module of the target's model."""
        try:
            self.model.get_submodule(module_path(name))
        except AttributeError:
            return False
        return True

    def module_type(self, name: str) -> str:
        """The class name of module ``name``."""
        return type(self.model.get_submodule(module_path(name))).__name__

    def correct_twin(self) -> nn.Module:
        """The reference copy with its parameters rounded to the actual dtype and back.

        Its modules compute as a correct kernel at the actual precision does: from the
        stored (rounded) weights, in float32, with buffers (``inv_freq``) as constructed
        in float32; :class:`ReferencePrecision` rounds their outputs to the actual dtype.
        """
        twin = copy.deepcopy(self.reference_model)
        with torch.no_grad():
            for p in twin.parameters():
                if p.is_floating_point():
                    p.copy_(p.to(self.run.dtype).to(p.dtype))
        return twin

    def floor(self, modules: Sequence[str]) -> float | None:
        """The output error of a correct run at the actual precision (None: unknown).

        Every finding's module computed correctly at the actual precision
        (:meth:`correct_twin`), the rest of the model as the device computes it:
        the findings say the rest is right, so this is the error a correct run of
        this model at this precision carries. Unknown without a module to correct.
        """
        known = [m for m in modules if self.has_module(m)]
        if not known:
            return None
        return self.measure(self.forward([self.at_reference(known, self.correct_twin())]))


def within_floor(error: float | None, floor: float | None) -> bool | None:
    """Whether an output ``error`` is within the ``floor`` of a correct run (None: unknown)."""
    if error is None or floor is None or not math.isfinite(error):
        return None if error is None or floor is None else False
    return error <= FLOOR_SLACK * floor


def remedy_check(
    remedy: str,
    summary: str,
    before: float,
    after: float,
    floor: float | None,
    note: str = "",
    within_note: str = "",
) -> RemedyCheck:
    """A remedy re-run and judged (:func:`judge_remedy`): ``before`` -> ``after`` against
    ``floor``; an error within the floor already is *not needed*, ``within_note``
    (when given) its note instead of ``note``."""
    verdict = judge_remedy(before, after, floor)
    if verdict == "not needed":
        note = within_note or note
    return RemedyCheck(
        remedy=remedy,
        summary=summary,
        before=before,
        after=after,
        floor=floor,
        verdict=verdict,
        note=note,
    )


def not_run(
    remedy: str, summary: str, why: str, before: float | None = None, floor: float | None = None
) -> RemedyCheck:
    """A remedy that could not be re-run, and ``why`` in one line."""
    return RemedyCheck(
        remedy=remedy, summary=summary, before=before, floor=floor, verdict="not run", note=why
    )


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``actual``'s relative L2 error against ``expected`` (:func:`precguard.numerics.measure`,
    compare's sums); inf if not finite; the share of unequal elements for integer outputs."""
    if actual.numel() != expected.numel():
        raise UsageError(
            f"the actual output has {actual.numel()} elements, the reference "
            f"{expected.numel()}: they cannot be compared"
        )
    if not bool(torch.isfinite(actual).all()):
        return math.inf
    if not (actual.is_floating_point() or expected.is_floating_point()):
        return exact_metrics(expected, actual).error
    return measure(actual, expected).rel_l2


def share_of(before: float, after: float) -> float | None:
    """``(before - after) / before``; None when ``before`` is 0 or either is not finite."""
    if not (math.isfinite(before) and math.isfinite(after)) or before <= 0:
        return None
    return (before - after) / before


def error_budget(
    side: ActualSide,
    findings: Iterable[tuple[str, str]],
    *,
    note: str = "",
) -> ErrorBudget:
    """The output error split over ``findings`` ((module, found by) pairs), largest share first."""
    found_by: dict[str, list[str]] = {}
    for module, source in dict.fromkeys(findings):  # each (module, source) once, in order
        found_by.setdefault(module, []).append(source)
    before = side.output_error()
    impacts: list[Impact] = []
    measured: list[str] = []
    for module, sources in found_by.items():
        if not side.has_module(module):
            impacts.append(
                Impact(
                    module=module,
                    found_by=sources,
                    before=before,
                    note="not a module of the target (a function, or another model's name)",
                )
            )
            continue
        try:
            after = side.output_error([module])
        except PrecguardError as exc:
            impacts.append(Impact(module=module, found_by=sources, before=before, note=str(exc)))
            continue
        measured.append(module)
        impacts.append(
            Impact(
                module=module,
                module_type=side.module_type(module),
                found_by=sources,
                before=before,
                after=after,
                share=share_of(before, after),
            )
        )
    together = side.output_error(measured) if measured else None
    shares = [i.share for i in impacts if i.share is not None]
    floor = side.floor(measured) if measured else None
    floor_share = (
        min(1.0, floor / before)
        if floor is not None and before > 0 and math.isfinite(before)
        else None
    )
    # the floor is a correct run's error, explained: never counted as unexplained
    unexplained = (
        max(0.0, 1.0 - (floor_share or 0.0) - sum(max(s, 0.0) for s in shares)) if shares else None
    )
    within = within_floor(before, floor)
    if within:
        unexplained = 0.0 if unexplained is not None else None
    together_share = share_of(before, together) if together is not None else None
    if together_share is not None and together_share < HELP_SHARE and before > 0:
        # the floor corrects only the findings' modules: with innocent findings it is the
        # error as it is, and "within the floor" would clear the real fault
        missed = (
            f"the findings together explain {max(together_share, 0.0):.0%} of the output "
            "error: either it is a correct run's, or its cause is a module no finding names "
            "(bisect --target searches every module; the floor corrects only the findings' "
            "modules and is then too high)"
        )
        note = f"{note}; {missed}" if note else missed
    run = side.run
    budget = ErrorBudget(
        measured="target",
        target=run.name,
        device=run.device,
        dtype=dtype_name(run.dtype),
        reference=side.golden.device,
        reference_dtype=dtype_name(side.golden.dtype),
        output_error=before,
        impacts=impacts,
        together=together,
        unexplained=unexplained,
        floor=floor,
        floor_share=floor_share,
        within_floor=within,
        floor_how=(
            "the findings' modules computed correctly at the actual precision (weights "
            "rounded to it, float32 inside, outputs rounded), the rest as the device computes it"
            if floor is not None
            else "unknown: no finding names a module of the target"
        ),
        note=note,
    )
    logger.info("impact_measured", modules=len(impacts), output_error=before)
    return budget.model_copy(update={"impacts": budget.ranked})


# -- findings of a comparison ------------------------------------------------------------------


def bisect_findings(result: BisectResult) -> list[tuple[str, str]]:
    """``bisect``'s culprits as findings for :func:`error_budget` (the root left out: a
    whole model at reference precision is no finding)."""
    return [(culprit, "bisect") for culprit in result.culprits if culprit != ROOT]


def opcheck_findings(result: OpCheckResult) -> list[tuple[str, str]]:
    """The modules an ``op-check --module`` sweep failed (a point over its tolerance or not
    finite) as findings for :func:`error_budget`; built-in ops name no module of a model."""
    failed = (p.module for p in result.results if p.module is not None and p.status != "pass")
    return [(module, "op-check") for module in dict.fromkeys(failed)]


def comparison_sides(
    result: Comparison,
    target: TargetSpec | Side,
    *,
    golden: Side | None = None,
    device: str | None = None,
    dtype: str | None = None,
    prepare: Callable[[nn.Module], Any] | None = None,
    what: str = "impact",
) -> tuple[Side, Side]:
    """The golden and actual :class:`~precguard.Side` s of ``result``, for a re-run of
    ``target`` (the code the actual side ran; never taken from a recording).

    The actual: ``target`` itself when it is a Side (it overrides what the recordings
    say), else ``target`` on the actual recording's device and dtype (``device``/``dtype``:
    re-run elsewhere). The golden: ``golden`` (a Side of the same target), else the
    golden recording's device and dtype (float32 when not recorded; the CPU when that
    device is not usable here). A keyword beside the Side it belongs to, or a golden of
    another target, is a usage error naming ``what``.

    >>> golden, actual = comparison_sides(result, "model.py", device="npu:1")  # doctest: +SKIP
    """
    if isinstance(target, Side):
        actual = one_side(target, what, device=device, dtype=dtype, prepare=prepare)
    else:
        actual = Side(
            target,
            device or (result.devices[1] if len(result.devices) > 1 else "cpu"),
            dtype or (result.dtypes[1] if len(result.dtypes) > 1 else None),
            prepare,
        )
    if golden is None:
        golden_device = result.devices[0] if result.devices else "cpu"
        golden_dtype = (result.dtypes[0] if result.dtypes else None) or "float32"
        try:
            resolve_backend(golden_device)
        except PrecguardError:
            golden_device = "cpu"
        golden = Side(actual.target, golden_device, golden_dtype)
    return golden_side(golden, actual, what), actual


def comparison_step(result: Comparison) -> int:
    """The batch a re-run of ``result`` runs on: its first divergence's step (else 0)."""
    return result.first_divergence.step if result.first_divergence is not None else 0


def comparison_side(
    result: Comparison,
    target: TargetSpec | Side,
    *,
    golden: Side | None = None,
    device: str | None = None,
    dtype: str | None = None,
    step: int | None = None,
    prepare: Callable[[nn.Module], Any] | None = None,
) -> ActualSide:
    """The actual side of ``result`` re-built from ``target`` beside its golden
    (:func:`comparison_sides`), on the first divergence's step (or ``step``)."""
    golden, actual = comparison_sides(
        result, target, golden=golden, device=device, dtype=dtype, prepare=prepare
    )
    return ActualSide.open(
        actual, golden=golden, step=comparison_step(result) if step is None else step
    )


def comparison_impact(
    result: Comparison,
    target: str | Target | Side | None,
    *,
    golden: Side | None = None,
    device: str | None = None,
    dtype: str | None = None,
    prepare: Callable[[nn.Module], Any] | None = None,
    side: ActualSide | None = None,
) -> ErrorBudget:
    """The error budget of ``result``'s local findings, measured by re-running ``target``.

    Without ``target`` (and ``side``): what the recordings allow, stated as such.
    ``target`` may be the actual :class:`~precguard.Side` and ``golden`` the reference
    Side (:func:`comparison_sides`); else ``device``/``dtype`` re-run the actual side
    elsewhere than its manifest says.

    >>> result = precguard.compare_runs("runs/cpu", "runs/bf16")              # doctest: +SKIP
    >>> budget = comparison_impact(result, "tiny-llama")                      # doctest: +SKIP
    >>> [(i.module, round(i.share, 2)) for i in budget.impacts]               # doctest: +SKIP
    [('model.rotary_emb', 0.58)]
    """
    findings, left_out = comparison_findings(result)
    if side is None and target is None:
        return recordings_only(result, reason="no --target was given")
    if golden is None and len({_target_identity(t) for t in result.targets if t}) > 1:
        g_target, a_target = result.targets[:2]
        return recordings_only(
            result,
            reason=(
                f"the recordings were made from two targets (golden {g_target!r}, actual "
                f"{a_target!r}): a re-run builds both sides from one, so it cannot measure "
                "what the recordings differ by"
            ),
        )
    note = f"left out: {', '.join(left_out)}" if left_out else ""
    if not findings:
        return ErrorBudget(
            measured="target",
            target=spec_name(target) if target is not None else None,
            note="no local forward finding to measure" + (f"; {note}" if note else ""),
        )
    if side is None:
        assert target is not None
        side = comparison_side(
            result, target, golden=golden, device=device, dtype=dtype, prepare=prepare
        )
    budget = error_budget(side, findings, note=note)
    recorded = recorded_output_error(result, side.step, side.expected.numel())
    if recorded is None or budget.output_error is None:
        return budget
    notes = [budget.note] if budget.note else []
    if abs(budget.output_error - recorded) > REPRODUCED * recorded:
        notes.append(
            f"the re-run's output error {budget.output_error:.3g} is not the recordings' "
            f"{recorded:.3g}: the target or device may not be what the actual side ran"
        )
    return budget.model_copy(update={"recorded_output_error": recorded, "note": "; ".join(notes)})


def _target_identity(spec: str) -> str:
    """A manifest's target spec as the code it names: a file by its name (a run recorded
    from another directory gives another path to the same file), a built-in by its name."""
    file, sep, function = spec.partition(":")
    if file.endswith(".py") or "/" in file:
        return f"{Path(file).name}{sep}{function}"
    return spec


def recorded_output_error(result: Comparison, step: int, numel: int) -> float | None:
    """The root module's first forward output error at ``step`` in ``result`` (full tensors
    of ``numel`` elements only; None when the recordings do not hold it)."""
    root_output = (ROOT, "forward", "output", 0, step, 0)
    for rec in result.records:
        if (rec.module, rec.phase, rec.role, rec.index, rec.step, rec.call) != root_output:
            continue
        metrics = rec.metrics
        size = math.prod(rec.shape) if rec.shape else 0
        if metrics is None or metrics.level != "full" or size != numel:
            return None
        return metrics.rel_l2 if metrics.rel_l2 is not None else metrics.error
    return None


__all__ = [
    "ActualSide",
    "Change",
    "bisect_findings",
    "comparison_findings",
    "comparison_impact",
    "comparison_side",
    "comparison_sides",
    "comparison_step",
    "error_budget",
    "judge_remedy",
    "not_run",
    "opcheck_findings",
    "recorded_output_error",
    "recordings_only",
    "relative_error",
    "share_of",
]
