"""The report models: what a check finds and what a checklist run concludes.

They live below the runner, the checks and the checklist (which build them) so
that reading and rendering a saved diagnosis (``precguard report``) needs none
of those. A :class:`Finding` and its ``Status`` are the checks' contract with the
plugin registry, defined below it in :mod:`precguard.checkspec` and re-exported here.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from precguard.checkspec import Finding, Status
from precguard.compare.impact_report import ErrorBudget
from precguard.errors import ExitCode

#: version of the Diagnosis file format
SCHEMA_VERSION = 1

#: exit code of a run in which no check produced a result (all skipped, or none selected):
#: neither a pass (nothing was shown to be right) nor a failure (nothing was found wrong);
#: the old name of :attr:`precguard.errors.ExitCode.INCONCLUSIVE`
EXIT_INCONCLUSIVE = ExitCode.INCONCLUSIVE

#: the input cases of the norm checks (``norm.*`` evidence is keyed by them), as reports label them
NORM_CASE_LABELS = {
    "typical": "typical rows (standard normal)",
    "constant_rows": "constant rows (variance 0)",
    "near_constant": "near-constant rows (std 1e-3 of the value)",
    "mean_offset": "rows whose mean is 1000x their std",
    "tiny_variance": "rows of tiny variance (|x| ~ 1e-4)",
    "massive_activations": "massive activations (two channels at 2e3 and 1e4)",
    "outlier_per_row": "one outlier per row (100x the rest)",
}


class Diagnosis(BaseModel):
    """Everything one checklist run found, most likely root cause first."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    schema_version: int = Field(default=SCHEMA_VERSION, description="Diagnosis format version.")
    checklist: str = Field(description="Name of the checklist that ran.")
    target: str | None = Field(description="Target the checks ran on.")
    device: str = Field(description="Device under test.")
    reference: str = Field(description="Reference device.")
    dtype: str = Field(description="Dtype of the model's parameters on the device.")
    compute_dtype: str | None = Field(
        default=None, description="Precision the device was found to compute in (by experiment)."
    )
    golden: str | None = Field(default=None, description="Golden recording, if one was given.")
    verdict: Literal["pass", "fail", "inconclusive"] = Field(
        description="'fail' when any finding failed or errored; 'inconclusive' when no check "
        "produced a result (every one skipped, or none was selected); else 'pass'."
    )
    counts: dict[str, int] = Field(description="Number of findings per status.")
    root_causes: list[Finding] = Field(
        description="Failed, errored and warned findings, the most likely root cause first "
        "(fail before error before warn; upstream families such as env, rng, data and "
        "tokenizer before the numeric symptoms they cause)."
    )
    findings: list[Finding] = Field(description="Every finding, in checklist order.")
    durations: dict[str, float] = Field(description="Seconds each check took.")
    duration_s: float = Field(description="Seconds the whole run took.")
    created: str = Field(description="ISO 8601 time the run started.")
    impact: ErrorBudget | None = Field(
        default=None,
        description="With check --verify: the flagged findings' modules ranked by their share "
        "of the output error, each with its remedies verified by re-running (docs/impact.md).",
    )

    @property
    def root_cause(self) -> Finding | None:
        """The most likely root cause, or None when nothing failed or warned."""
        return self.root_causes[0] if self.root_causes else None

    @property
    def exit_code(self) -> int:
        """The CLI's exit code (:class:`~precguard.errors.ExitCode`): 0 pass, 1 fail, 3
        inconclusive."""
        return {"pass": ExitCode.PASS, "fail": ExitCode.FAIL}.get(
            self.verdict, ExitCode.INCONCLUSIVE
        )


__all__ = [
    "EXIT_INCONCLUSIVE",
    "NORM_CASE_LABELS",
    "SCHEMA_VERSION",
    "Diagnosis",
    "Finding",
    "Status",
]
