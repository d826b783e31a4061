"""Compare options: the one object ``compare_runs``, the CLI, the workers and the guard share.

Every caller builds one :class:`CompareOptions` (a worker process from the
coordinator's JSON of it), and the comparison reads its settings from it only.

>>> options = CompareOptions(profile="strict", step=0)           # doctest: +SKIP
>>> precguard.compare_runs("runs/cpu", "runs/npu", options)      # doctest: +SKIP
>>> precguard.compare_runs("runs/cpu", "runs/npu", profile="strict", step=0)  # the same
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from precguard.compare.metrics import TOLERANCE_MODES, is_float_dtype
from precguard.compare.tolerance import Profile, get_profile
from precguard.errors import UsageError

#: short dtype names accepted by ``tolerance_dtype``
DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}


class CompareOptions(BaseModel):
    """How to compare two recordings. Unknown options are an error.

    A bad value of ``tolerance_dtype`` or ``workers`` is a
    :class:`~precguard.errors.UsageError` (the CLI's exit 2 with one line); a
    value of the wrong type is pydantic's ``ValidationError`` naming the field.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: str | Profile = Field(
        default="default",
        description="Tolerance profile: a name (default, fixed, strict, msprobe) or a Profile.",
    )
    rtol: float | None = Field(
        default=None,
        description="Override the profile's relative tolerance for every dtype (rel_l2 keeps "
        "its ratio to rtol).",
    )
    atol: float | None = Field(default=None, description="Override the absolute tolerance.")
    rank: int | None = Field(
        default=None, description="Compare only this rank (default: every rank both recorded)."
    )
    step: int | None = Field(
        default=None, description="Compare only this step (default: every step)."
    )
    suspects: int | None = Field(
        default=None,
        description="How many further suspects to list (default: every module call with a "
        "local error of its own).",
    )
    tolerance_dtype: str = Field(
        default="auto",
        description="'auto' ('actual' is the same): judge each pair by the less precise of "
        "the two sides' compute precisions; 'golden': by the golden's; or a float dtype "
        "name (bf16, fp16, fp32, fp64 accepted). Stored by its full name.",
    )
    rename: tuple[str, ...] = Field(
        default=(),
        description="OLD=NEW module rename rules (globs), applied to both sides after "
        "wrapper prefixes (DDP, FSDP, torch.compile, checkpointing) are stripped.",
    )
    workers: int = Field(
        default=1,
        description="Processes that compare (rank, step) units in parallel; the result is "
        "the same as with one (precguard.compare.parallel).",
    )
    calibration: Path | None = Field(
        default=None,
        description="A second golden recording of the same code at the golden's precision, "
        "inputs perturbed by one unit roundoff of the actual's (compare/calibrate.py): it "
        "raises each record's expected error to the sensitivity it measures.",
    )

    @field_validator("tolerance_dtype")
    @classmethod
    def _known_tolerance_dtype(cls, value: str) -> str:
        value = DTYPE_ALIASES.get(value, value)
        if value not in TOLERANCE_MODES and not is_float_dtype(value):
            raise UsageError(
                f"--tolerance-dtype must be one of {', '.join(TOLERANCE_MODES)} or a float "
                f"dtype (float32, bfloat16, float16, float64), got {value!r}"
            )
        return value

    @field_validator("workers")
    @classmethod
    def _positive_workers(cls, value: int) -> int:
        if value < 1:
            raise UsageError(f"--workers must be >= 1, got {value}")
        return value

    def resolved_profile(self) -> Profile:
        """The profile to judge by: ``profile`` (by name or as given), rtol/atol applied."""
        prof = get_profile(self.profile) if isinstance(self.profile, str) else self.profile
        return prof.with_overrides(self.rtol, self.atol)


def compare_options(options: CompareOptions | None = None, **overrides: Any) -> CompareOptions:
    """``options`` (default: all defaults) with the keyword ``overrides`` applied, validated.

    What :func:`~precguard.compare.runs.compare_runs` does with its keyword
    arguments: ``compare_runs(g, a, profile="strict")`` compares with
    ``CompareOptions(profile="strict")``; given both, the keywords win.
    """
    if not overrides:
        return options if options is not None else CompareOptions()
    given = options.model_dump(exclude_unset=True) if options is not None else {}
    return CompareOptions.model_validate({**given, **overrides})
