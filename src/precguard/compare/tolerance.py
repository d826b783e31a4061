"""Named tolerance profiles, keyed by dtype, and the pass/fail test of one record.

Every number here has a source (docs/compare.md, "Tolerance numbers"): ``rtol``/``atol``
are ``torch.testing.assert_close``'s defaults per dtype; ``rel_l2`` is k x rtol with
torch dynamo's accuracy factor k (2 for fp32/fp64, 3 for fp16/bf16); ``min_cosine``
0.99 and ``max_abs`` 1e-3 are Ascend msprobe's rule; ``amplification`` 10 is
precguard's choice, an order of magnitude.
"""

from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict, Field

from precguard.compare.levels import FullMetrics, MeasuredMetrics
from precguard.compare.report import Metrics, RecordResult, Status
from precguard.compare.rule import BaseRule, Pass, Settlement, StepContext
from precguard.errors import UsageError
from precguard.numerics import (
    AMPLIFICATION,
    BIAS_Z,
    SIGNIFICAND_BITS,
    ladder,
    scale_excess,
    unit_roundoff,
)


class DtypeTolerance(BaseModel):
    """Thresholds for one dtype."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    rtol: float = Field(description="Relative tolerance (assert_close).")
    atol: float = Field(description="Absolute tolerance (assert_close).")
    rel_l2: float = Field(description="Largest allowed ||a-g|| / ||g||.")
    min_cosine: float = Field(description="Smallest allowed cosine similarity.")
    max_abs: float | None = Field(
        default=None,
        description="msprobe rule: fail only when cosine < min_cosine AND max-abs-err > this; "
        "None disables the cosine rule's max-abs escape.",
    )
    stats_rtol: float = Field(description="Largest allowed statistic difference (stats level).")


class Profile(BaseModel):
    """A named set of per-dtype thresholds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(description="Profile name.")
    description: str = Field(description="What it is for and where its numbers come from.")
    rule: str = Field(
        description="'expected' (the default: each record against its expected error, "
        "judged per step), 'rel_l2' (fixed k*rtol), 'strict' or 'msprobe'."
    )
    dtypes: dict[str, DtypeTolerance] = Field(description="Thresholds per dtype name.")
    amplification: float = Field(
        default=AMPLIFICATION,
        description="Output/input error ratio from which a module is 'local'.",
    )
    bias_z: float = Field(
        default=BIAS_Z,
        description="Standard errors by which the scale of actual on golden must differ from "
        "1 to count as a systematic error (inf disables the bias test).",
    )
    bias_floor_ulps: float = Field(
        default=1.0,
        description="Unit roundoffs of the tolerance dtype a systematic error must exceed "
        "on top of bias_z standard errors.",
    )
    bias_floor: float | None = Field(
        default=None,
        description="A relative scale error a systematic error must exceed instead of "
        "bias_floor_ulps unit roundoffs (set by --rtol: a tolerance of 1% accepts a 1% bias).",
    )

    def for_dtype(self, dtype: str) -> DtypeTolerance:
        """Thresholds for ``dtype`` (float32's for dtypes the profile does not list)."""
        return self.dtypes.get(dtype) or self.dtypes["float32"]

    def with_overrides(self, rtol: float | None, atol: float | None) -> Profile:
        """A copy with ``rtol``/``atol`` replaced in every dtype (``--rtol``/``--atol``).

        ``rel_l2`` and ``stats_rtol`` follow ``rtol`` with the same factor as before.
        """
        if rtol is None and atol is None:
            return self
        for name, value in (("rtol", rtol), ("atol", atol)):
            if value is not None and not (value >= 0 and math.isfinite(value)):
                raise UsageError(f"--{name} must be a finite number >= 0, got {value}")
        dtypes = {}
        for name, tol in self.dtypes.items():
            update: dict[str, float] = {}
            if rtol is not None:
                scale = rtol / tol.rtol if tol.rtol else 1.0
                update.update(
                    rtol=rtol, rel_l2=tol.rel_l2 * scale, stats_rtol=tol.stats_rtol * scale
                )
            if atol is not None:
                update["atol"] = atol
            dtypes[name] = tol.model_copy(update=update)
        update: dict[str, object] = {"dtypes": dtypes, "name": f"{self.name}+custom"}
        if self.rule == "expected":  # a number the user gives is a fixed tolerance
            update["rule"] = "rel_l2"
        if rtol is not None:
            update["bias_floor"] = rtol
        return self.model_copy(update=update)


#: per dtype: assert_close's (rtol, atol) and dynamo's k (a run may carry k times the
#: reference's own error); tfloat32 and hfloat32, not in assert_close, have fp16's
#: significand and one bit more
_ASSERT_CLOSE = {
    "float16": (1e-3, 1e-5, 3.0),
    "tfloat32": (1e-3, 1e-5, 3.0),
    "hfloat32": (5e-4, 1e-5, 3.0),
    "bfloat16": (1.6e-2, 1e-5, 3.0),
    "float32": (1.3e-6, 1e-5, 2.0),
    "float64": (1e-7, 1e-7, 2.0),
}


def _dtypes(
    dynamo_k: bool, max_abs: float | None = None, **update: float
) -> dict[str, DtypeTolerance]:
    """assert_close's rtol and atol per dtype, ``rel_l2`` and ``stats_rtol`` k x rtol
    (dynamo's k, or 1), cosine 0.99; ``update`` replaces either bound."""
    out = {}
    for name, (rtol, atol, k) in _ASSERT_CLOSE.items():
        bound = k * rtol if dynamo_k else rtol
        fields = {"rel_l2": bound, "stats_rtol": bound, **update}
        out[name] = DtypeTolerance(rtol=rtol, atol=atol, min_cosine=0.99, max_abs=max_abs, **fields)
    return out


_FIXED = Profile(
    name="fixed",
    description="Fail when ||a-g||/||g|| > k*rtol (rtol from torch.testing.assert_close, "
    "k from torch dynamo's accuracy check: 2 for fp32/fp64, 3 for fp16/bf16), when "
    "cosine < 0.99 (msprobe), or when NaN/Inf differ.",
    rule="rel_l2",
    dtypes=_dtypes(dynamo_k=True),
)
_EXPECTED = _FIXED.model_copy(
    update={
        "name": "default",
        "rule": "expected",
        "description": "Judge every record by the error its precision explains: one "
        "rounding, the accumulation error of its reduction length and the errors of what "
        "it consumed (inputs, parameters, submodules' outputs); fail beyond "
        "amplification (10) times that, on a significant systematic scale error of its "
        "own, or when NaN/Inf differ (docs/compare.md).",
    }
)
_STRICT = Profile(
    name="strict",
    description="torch.testing.assert_close semantics: every element within "
    "atol + rtol*|golden| (atol raised to rtol*rms(golden) for small-scale tensors), and "
    "||a-g||/||g|| <= rtol.",
    rule="strict",
    dtypes=_dtypes(dynamo_k=False),
)
_MSPROBE = Profile(
    name="msprobe",
    bias_z=math.inf,
    description="Ascend msprobe's compare verdict: fail when cosine < 0.99 and "
    "max-abs-err > 1e-3, or cosine < 0.9, or max-abs-err > 1, or NaN/Inf appear. Lax: "
    "it passes many real faults; use it to reproduce msprobe's result.",
    rule="msprobe",
    dtypes=_dtypes(dynamo_k=True, rel_l2=math.inf, max_abs=1e-3),
)

PROFILES: dict[str, Profile] = {p.name: p for p in (_EXPECTED, _FIXED, _STRICT, _MSPROBE)}


def get_profile(name: str) -> Profile:
    """Return the built-in profile ``name`` or raise UsageError listing the known ones."""
    profile = PROFILES.get(name)
    if profile is None:
        raise UsageError(
            f"unknown tolerance profile {name!r}; expected one of: {', '.join(PROFILES)}"
        )
    return profile


def settle(metrics: Metrics, profile: Profile, s: Settlement) -> None:
    """What one compared pair is allowed under the profile's rule, in ``s``: the error
    bound of its level and dtype, and its other tests (cosine, a systematic scale, the
    strict rule's elements, msprobe's rule) as a finding."""
    if ladder(metrics) is not None:  # non-finite, exact, nothing measurable
        return
    tol = profile.for_dtype(metrics.dtype)
    if metrics.level == "stats":
        s.allowed = tol.stats_rtol
        return
    # the ladder settled exact and none: what is left is full
    assert isinstance(metrics, FullMetrics)
    assert metrics.cosine is not None and metrics.max_abs_err is not None
    if profile.rule == "msprobe":  # its own published rule, not an error bound
        s.found = (
            (metrics.cosine < tol.min_cosine and metrics.max_abs_err > (tol.max_abs or 0.0))
            or metrics.cosine < 0.9
            or metrics.max_abs_err > 1.0
        )
        return
    s.allowed = tol.rel_l2
    s.found = metrics.cosine < tol.min_cosine or bool(metrics.bias)
    s.found = s.found or (profile.rule == "strict" and (metrics.close_share or 0.0) > 0)


def judge(metrics: Metrics, profile: Profile) -> Status:
    """Return ``pass``, ``fail`` or ``nonfinite`` for one compared pair (:func:`settle`)."""
    s = Settlement()
    settle(metrics, profile, s)
    return s.verdict(metrics)


class ProfileRule(BaseRule):
    """A fixed profile (``fixed``, ``strict``, ``msprobe``) as a rule of compare's one pass
    (compare/rules.py): each record against its dtype's tolerance (:func:`settle`)."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile

    @classmethod
    def for_step(cls, ctx: StepContext) -> ProfileRule | None:
        """The rule, under a profile whose rule is not the expected-error judge."""
        return None if ctx.profile.rule == "expected" else cls(ctx.profile)

    def settle(self, r: RecordResult, s: Settlement, step: Pass) -> RecordResult:
        """The record against its dtype's tolerance."""
        assert r.metrics is not None
        settle(r.metrics, self.profile, s)
        return r


def with_bias(metrics: Metrics, profile: Profile) -> Metrics:
    """``metrics`` with ``bias`` set when its scale shows a significant systematic error: a
    scale excess (:func:`precguard.numerics.scale_excess`, beyond ``bias_z`` standard
    errors) above ``bias_floor``, or else ``bias_floor_ulps`` unit roundoffs."""
    if not isinstance(metrics, MeasuredMetrics) or not math.isfinite(profile.bias_z):
        return metrics
    if metrics.scale is None or metrics.scale_se is None:
        return metrics
    floor = profile.bias_floor
    if floor is None:
        floor = profile.bias_floor_ulps * unit_roundoff(metrics.dtype)
    if not scale_excess(metrics.scale, metrics.scale_se, profile.bias_z) > floor:
        return metrics
    return metrics.model_copy(update={"bias": True})


__all__ = [
    "PROFILES",
    "SIGNIFICAND_BITS",
    "DtypeTolerance",
    "Profile",
    "ProfileRule",
    "get_profile",
    "judge",
    "settle",
    "unit_roundoff",
    "with_bias",
]
