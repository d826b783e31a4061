"""The report models of a finding's impact and of a remedy verified by re-running.

``localize/impact.py`` measures them and ``localize/verify.py`` fills the remedies;
they live here so that Comparison and the checklist's Diagnosis can hold them, with the
judgement of a remedy's re-run (:func:`judge_remedy`: compare's report needs no torch).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from precguard.numerics import FLOOR_SLACK, HELP_SHARE

_FROZEN = ConfigDict(frozen=True, ser_json_inf_nan="strings")

RemedyVerdict = Literal["verified", "not needed", "partial", "did not help", "not run"]


class RemedyCheck(BaseModel):
    """One remedy applied mechanically to the actual side, and the output error it left."""

    model_config = _FROZEN

    remedy: str = Field(
        description="Remedy id: reference-precision, float32-compute, float32-buffers, "
        "float32-loss, or switch:NAME (a plugin's declared switch)."
    )
    summary: str = Field(description="What was applied, in the user's words.")
    before: float | None = Field(description="Output error as the actual side computes it.")
    after: float | None = Field(default=None, description="Output error with the remedy applied.")
    floor: float | None = Field(
        default=None,
        description="Output error of a correct run at the actual precision (None: unknown); "
        "see docs/impact.md for how it is obtained.",
    )
    verdict: RemedyVerdict = Field(
        description="verified: the error fell to within the floor of a correct run; not "
        "needed: the output error was within the floor already; partial: it fell but "
        "stays above the floor; did not help: it removed under a tenth of the excess over "
        "the floor (or made it worse); not run: see note."
    )
    note: str = Field(default="", description="Why it was not run, or what the result means.")

    def describe(self) -> str:
        """One line: ``verified: output error 0.0561 -> 0.0238, the floor ... is 0.0238``."""
        if self.verdict == "not run" or self.after is None or self.before is None:
            return f"{self.summary}: not run ({self.note})" if self.note else self.summary
        note = f" ({self.note})" if self.note else ""
        if self.verdict == "not needed":
            floor = f" of a correct run ({self.floor:.3g})" if self.floor is not None else ""
            with_it = f"; with it {self.after:.3g}" if self.after != self.before else ""
            line = f"{self.summary}: not needed: output error {self.before:.3g} is within "
            return f"{line}the floor{floor}{with_it}{note}"
        floor = f"{self.floor:.3g}" if self.floor is not None else "unknown"
        line = f"{self.summary}: {self.verdict}: output error {self.before:.3g} -> {self.after:.3g}"
        return f"{line}, the floor of a correct run is {floor}{note}"


class Impact(BaseModel):
    """How much of the model's output error one local finding's module accounts for."""

    model_config = _FROZEN

    module: str = Field(description="Qualified module name of the finding.")
    module_type: str | None = Field(default=None, description="Its class name in the target.")
    found_by: list[str] = Field(
        default_factory=list,
        description="What named it: 'first divergence', 'suspect', a check id, 'bisect'.",
    )
    before: float | None = Field(
        default=None, description="Output error (relative L2 of the logits) as computed."
    )
    after: float | None = Field(
        default=None, description="Output error with this module at reference precision."
    )
    share: float | None = Field(
        default=None,
        description="(before - after) / before: the share of the output error this module "
        "accounts for (negative: it was better with the module on the device).",
    )
    remedies: list[RemedyCheck] = Field(
        default_factory=list, description="With --verify: each remedy applied and its result."
    )
    note: str = Field(default="", description="Why it was not measured, if it was not.")

    def describe(self) -> str:
        """One line: ``model.rotary_emb: output error 0.024 -> 0.0238 with it at ...``."""
        if self.before is None or self.after is None or self.share is None:
            return f"{self.module}: impact not measured ({self.note})"
        return (
            f"{self.module}: output error {self.before:.3g} -> {self.after:.3g} with it at "
            f"reference precision ({self.share:.0%} of the output error)"
        )


class ErrorBudget(BaseModel):
    """The model's output error split over the local findings' modules, largest share first."""

    model_config = _FROZEN

    measured: Literal["target", "recordings"] = Field(
        description="'target': measured by re-running the target; 'recordings': only what "
        "the recordings allow (no counterfactual: the shares are unknown)."
    )
    target: str | None = Field(default=None, description="The target re-run.")
    device: str | None = Field(default=None, description="Device the actual side re-ran on.")
    dtype: str | None = Field(default=None, description="Its model dtype.")
    reference: str | None = Field(default=None, description="Reference device.")
    reference_dtype: str | None = Field(default=None, description="Reference model dtype.")
    metric: str = Field(default="rel_l2", description="Output error metric (of the logits).")
    output_error: float | None = Field(
        default=None, description="The model's output error as the actual side computes it."
    )
    recorded_output_error: float | None = Field(
        default=None,
        description="The root output's error in the comparison of the recordings (None: not "
        "recorded in full); a re-run far from it did not reproduce the actual side.",
    )
    impacts: list[Impact] = Field(
        default_factory=list, description="Each local finding, the largest share first."
    )
    together: float | None = Field(
        default=None, description="Output error with every measured module at reference."
    )
    unexplained: float | None = Field(
        default=None,
        description="The share of the output error neither the floor nor a single module "
        "explains: 1 - floor_share - the sum of the positive shares, at least 0 "
        "(interactions, and error spread over the other modules). 0 when the output error "
        "is within the floor: a correct run's error is explained, by the floor.",
    )
    floor: float | None = Field(
        default=None,
        description="Output error of a correct run at the actual precision (None: unknown).",
    )
    floor_share: float | None = Field(
        default=None,
        description="floor / output_error, at most 1: the share of the output error a "
        "correct run at this precision carries too (None: floor unknown).",
    )
    within_floor: bool | None = Field(
        default=None,
        description="True: the output error is within the floor of a correct run (within "
        "numerics.FLOOR_SLACK of it): the findings are real but the output is not affected; "
        "None: unknown (no floor, or nothing re-run).",
    )
    floor_how: str = Field(default="", description="How the floor was obtained.")
    switches: list[RemedyCheck] = Field(
        default_factory=list,
        description="With --verify: the device switches plugins declare (another emu: "
        "profile, a vendor flag), each run on the whole model.",
    )
    note: str = Field(default="", description="What could not be measured, and why.")

    @property
    def ranked(self) -> list[Impact]:
        """The measured impacts, the largest share first (unmeasured ones last)."""
        return sorted(self.impacts, key=lambda i: (i.share is None, -(i.share if i.share else 0.0)))


def judge_remedy(before: float, after: float, floor: float | None) -> RemedyVerdict:
    """verified, not needed, partial or did not help, for an output error ``before`` ->
    ``after`` against the ``floor`` of a correct run.

    *not needed* when ``before`` is within the floor already (there is nothing to fix:
    "did not help" would read as a failed fix); *verified* when ``after`` is; *did not
    help* only when the remedy removed under :data:`HELP_SHARE` of the excess over the
    floor (or made it worse), so never for a remedy that reached the floor.
    """
    if not math.isfinite(after):
        return "did not help"
    if floor is not None and before <= FLOOR_SLACK * floor:
        return "not needed"
    if floor is not None and after <= FLOOR_SLACK * floor:
        return "verified"
    target = floor if floor is not None else 0.0
    excess = before - target
    if not math.isfinite(before):
        return "partial"
    if excess <= 0 or before - after < HELP_SHARE * excess:
        return "did not help"
    return "partial"
