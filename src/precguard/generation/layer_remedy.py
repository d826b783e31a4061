"""``generate-diff --verify`` when the cause is a layer: its remedies re-run as compare's.

The layerwise replay names a module; the remedies of that module
(:func:`precguard.compare.candidates`, in their order) are applied to the actual
side's model and the output error measured again on the target's own batch, as
``compare --target --verify`` does (:mod:`precguard.localize.verify`). When that
cannot be done (the target has no model or batch of its own, the module is not
one of its modules, the re-run fails), one ``not run`` check says why in one line.
"""

from __future__ import annotations

from precguard.compare.advice import ordered
from precguard.compare.impact_report import RemedyCheck
from precguard.errors import PrecguardError
from precguard.target_run import Side


def layer_remedies(actual: Side, golden: Side, module: str | None) -> list[RemedyCheck]:
    """The remedies of layer ``module`` re-run on ``actual`` against ``golden``, or one
    ``not run`` check saying in one line why they cannot be."""
    summary = f"the remedies of {module or 'the named layer'}"

    from precguard.localize.impact import ActualSide, error_budget, not_run
    from precguard.localize.verify import verify_remedies

    def why_not(why: str) -> list[RemedyCheck]:
        return [not_run("none", summary, why)]

    if not module:
        return why_not("the layerwise replay named no module")

    try:
        side = ActualSide.open(actual, golden=golden.replace(target=actual.target))
        if not side.has_module(module):
            return why_not(f"{module} is not a module of the target's model")
        budget = verify_remedies(side, error_budget(side, [(module, "generate-diff")]))
    except PrecguardError as exc:
        return why_not(f"the target's model could not be re-run on its batch: {exc}")
    checks = [c for impact in budget.impacts for c in impact.remedies]
    return ordered(checks) or why_not(f"no mechanical remedy applies to {module}")


__all__ = ["layer_remedies"]
