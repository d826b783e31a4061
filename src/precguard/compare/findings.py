"""A comparison's findings and what its recordings alone say of their impact.

Read from a :class:`~precguard.compare.report.Comparison` without re-running anything, so
compare's report of statistics needs no torch; ``localize/impact.py`` measures the impact
with a target and re-exports these.
"""

from __future__ import annotations

from precguard.compare.impact_report import ErrorBudget, Impact
from precguard.compare.report import Comparison


def comparison_findings(result: Comparison) -> tuple[list[tuple[str, str]], list[str]]:
    """The local forward findings of ``result`` as (module, found by), and what was left out."""
    found: list[tuple[str, str]] = []
    left_out: list[str] = []
    first = result.first_divergence
    if first is not None and first.local is not False:
        if first.phase == "forward":
            found.append((first.module, "first divergence"))
        else:
            left_out.append(f"{first.module} (in the backward: the logits do not show it)")
    for suspect in result.suspects:
        if suspect.phase == "forward":
            found.append((suspect.module, "suspect"))
        else:
            left_out.append(f"{suspect.module} (in the backward)")
    for replay in result.replays:
        if replay.replayed and replay.verdict == "diverged":
            found.append((replay.module, "replay"))
    return found, left_out


def recordings_only(result: Comparison, *, reason: str) -> ErrorBudget:
    """What the recordings allow without a target: the findings, no counterfactual shares."""
    findings, left_out = comparison_findings(result)
    impacts = [
        Impact(module=m, found_by=[s], note="needs --target: a recording cannot re-run a module")
        for m, s in dict(findings).items()
    ]
    note = (
        f"{reason}; the recordings hold each finding's own error but not the output error with "
        "the module fixed: impact needs --target (the code the actual side ran)"
    )
    if left_out:
        note += f"; left out: {', '.join(left_out)}"
    return ErrorBudget(measured="recordings", impacts=impacts, note=note)
