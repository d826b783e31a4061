"""The comparison report: pydantic models written as JSON by ``compare --json``.

The shape follows DESIGN.md's Comparison, plus ``rank`` on the first
divergence, the ``suspects`` after it, the ``profile`` used, counts, and
``fingerprint_diff`` (environment facts that differ between the two runs).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from precguard.compare.coverage import Coverage

COMPARISON_SCHEMA_VERSION = 1

_FROZEN = ConfigDict(frozen=True, ser_json_inf_nan="strings")

Status = Literal["pass", "fail", "missing", "nonfinite"]
Verdict = Literal["match", "diverged"]
Level = Literal["full", "stats", "exact", "none"]


class Metrics(BaseModel):
    """What was measured for one pair of records. Fields absent at a level are None."""

    model_config = _FROZEN

    level: Level = Field(
        description="'full': both full tensors were compared; 'stats': only the recorded "
        "statistics (a weaker test: equal statistics do not prove equal tensors); "
        "'exact': integer/bool tensors compared for equality; 'none': nothing comparable."
    )
    dtype: str = Field(description="dtype the tolerance was taken from (the less precise side).")
    error: float = Field(
        description="The scalar error used for local-vs-propagated decisions: relative L2 "
        "error (full), largest statistic difference (stats), share of unequal elements (exact)."
    )
    max_abs_err: float | None = Field(default=None, description="max |actual - golden|.")
    mean_abs_err: float | None = Field(default=None, description="mean |actual - golden|.")
    max_rel_err: float | None = Field(
        default=None,
        description="max |actual - golden| / max(|golden|, 1e-3 * rms(golden)); the floor "
        "keeps elements near zero from dominating.",
    )
    rmse: float | None = Field(default=None, description="Root mean square error.")
    rel_l2: float | None = Field(
        default=None, description="||actual - golden||_2 / ||golden||_2 (normalized RMSE)."
    )
    cosine: float | None = Field(default=None, description="Cosine similarity.")
    max_ulp: float | None = Field(
        default=None,
        description="Largest distance in units in the last place of the actual dtype "
        "(golden rounded to that dtype first).",
    )
    rel_err_share: dict[str, float] | None = Field(
        default=None,
        description="Share of elements whose guarded relative error exceeds each band "
        "('1e-2' = 1%, '1e-3' = 0.1%, '1e-4' = 0.01%).",
    )
    close_share: float | None = Field(
        default=None,
        description="Share of elements outside |a-g| <= atol + rtol*|g| (assert_close's test) "
        "with atol raised to rtol * rms(golden) for tensors of small scale.",
    )
    nan_mismatch: int = Field(default=0, description="Elements NaN on exactly one side.")
    inf_mismatch: int = Field(default=0, description="Elements ±Inf on one side but not equal.")
    stat_rel_diff: dict[str, float] | None = Field(
        default=None,
        description="Per statistic: |a - g| / max(|g|, rms(golden)) (stats level only).",
    )
    mismatched: int | None = Field(default=None, description="Unequal elements (exact level).")
    note: str | None = Field(default=None, description="Why the level is weaker, if it is.")


class RecordResult(BaseModel):
    """One aligned pair (or an unmatched record) and its status."""

    model_config = _FROZEN

    key: str = Field(description="Golden record key (actual's key if golden has none).")
    actual_key: str | None = Field(
        default=None, description="Actual record key when it differs (aligned by order)."
    )
    module: str = Field(description="Qualified module name.")
    module_type: str = Field(description="Module class name.")
    golden_dtype: str = Field(
        description="dtype of the golden tensor (of the only side if unmatched)."
    )
    actual_dtype: str | None = Field(default=None, description="dtype of the actual tensor.")
    shape: list[int] = Field(description="Golden shape.")
    phase: str = Field(description="forward or backward.")
    role: str = Field(description="input, output, param or grad.")
    step: int = Field(description="Step.")
    rank: int = Field(description="Rank.")
    seq: int = Field(description="Golden capture order (execution order).")
    status: Status = Field(description="pass, fail, missing (no counterpart) or nonfinite.")
    metrics: Metrics | None = Field(default=None, description="None when missing.")
    local: bool | None = Field(
        default=None,
        description="On failing forward outputs and parameters: True when the module made "
        "this error itself, False when it only passed it on; None elsewhere.",
    )
    amplification: float | None = Field(
        default=None,
        description="On failing forward outputs: the module's output error / input error.",
    )


class FirstDivergence(BaseModel):
    """Where the error was first introduced."""

    model_config = _FROZEN

    key: str = Field(description="Record that shows the introduction (output or param).")
    module: str = Field(description="Module that introduced the error.")
    module_type: str = Field(description="Its class name.")
    step: int = Field(description="Step.")
    rank: int = Field(description="Rank.")
    phase: str = Field(description="forward or backward.")
    metrics: Metrics = Field(description="Metrics of that record.")
    local: bool | None = Field(
        description="True: this module made the error itself (inputs within tolerance, or "
        "output error >= the amplification threshold times the input error); False: it only "
        "passed error on; None: undecidable (backward, or inputs not recorded)."
    )
    amplification: float | None = Field(
        default=None, description="Output error / max(input error, unit roundoff)."
    )
    input_error: float | None = Field(default=None, description="Largest input error.")
    reason: str = Field(description="One sentence saying why this module was named.")


class Suspect(BaseModel):
    """Another module that made error on its own, ranked by amplification."""

    model_config = _FROZEN

    module: str = Field(description="Module name.")
    module_type: str = Field(description="Class name.")
    key: str = Field(description="Its failing output (or param) record.")
    step: int = Field(description="Step.")
    rank: int = Field(description="Rank.")
    amplification: float | None = Field(description="Output / input error (None for params).")
    error: float = Field(description="Output error.")
    reason: str = Field(description="Why it is a suspect.")


class Unmatched(BaseModel):
    """Records with no counterpart on the other side."""

    model_config = _FROZEN

    golden_only: list[str] = Field(default_factory=list, description="Keys only in golden.")
    actual_only: list[str] = Field(default_factory=list, description="Keys only in actual.")


class Counts(BaseModel):
    """How many records ended in each status."""

    model_config = _FROZEN

    passed: int = Field(default=0, description="Records within tolerance.")
    failed: int = Field(default=0, description="Records outside tolerance.")
    nonfinite: int = Field(default=0, description="Records with NaN/Inf on one side only.")
    missing: int = Field(default=0, description="Records with no counterpart.")
    full: int = Field(default=0, description="Pairs compared on full tensors.")
    stats_only: int = Field(default=0, description="Pairs compared on statistics only.")


class Comparison(BaseModel):
    """The result of comparing an actual recording with a golden one."""

    model_config = _FROZEN

    schema_version: int = Field(
        default=COMPARISON_SCHEMA_VERSION, description="Version of this report format."
    )
    golden: str = Field(description="Golden recording directory.")
    actual: str = Field(description="Actual recording directory.")
    devices: list[str] = Field(
        default_factory=list, description="[golden device, actual device] from the manifests."
    )
    dtypes: list[str | None] = Field(
        default_factory=list, description="[golden model dtype, actual model dtype]."
    )
    profile: str = Field(description="Tolerance profile used.")
    tolerances: dict[str, Any] = Field(description="The numbers the profile applied, per dtype.")
    verdict: Verdict = Field(
        description="'match' when every aligned record is within tolerance; otherwise "
        "'diverged'. Unmatched records are listed but do not change the verdict."
    )
    first_divergence: FirstDivergence | None = Field(
        description="The first module that introduced error, in execution order."
    )
    suspects: list[Suspect] = Field(
        default_factory=list,
        description="Other modules that introduced error, most amplifying first.",
    )
    counts: Counts = Field(description="Records per status.")
    records: list[RecordResult] = Field(description="Every record, in golden execution order.")
    unmatched: Unmatched = Field(description="Records on one side only.")
    fingerprint_diff: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Environment fingerprint keys whose values differ: key -> [golden, actual] "
        "(None where one side lacks the key).",
    )
    warnings: list[str] = Field(default_factory=list, description="Things the user should know.")
    coverage: Coverage | None = Field(
        default=None,
        description="What was compared: steps, phases, whether both runs finished; "
        "'complete' false means the verdict covers only part of the recordings.",
    )

    @property
    def diverged(self) -> bool:
        """True when the verdict is 'diverged'."""
        return self.verdict == "diverged"
