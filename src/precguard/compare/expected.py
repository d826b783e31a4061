"""The error a module's precision explains, and the systematic error it cannot.

The expected error of a record is ``max(input error, rounding floor)``: one rounding
in its precision plus the accumulation error ``~sqrt(K) u_acc`` of its reductions
(Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019); the floor, the expected error and
the growth factor are defined once, in :mod:`precguard.numerics` (docs/compare.md,
"Rounding is not a fault: the expected error"). A systematic (scale) error hides
inside rounding noise element by element but not in aggregate: :func:`own_bias` is
the part of an output's scale error that its inputs' scale errors cannot explain
(docs/compare.md, "Systematic bias").
"""

from __future__ import annotations

import math
from typing import Any

from precguard.compare.levels import METRICS_LEVELS, MeasuredMetrics
from precguard.compare.report import Metrics
from precguard.compare.sampled import sampled_bounds
from precguard.compare.tolerance import Profile
from precguard.numerics import (
    BIAS_MAX_INPUT_ERROR,
    PRODUCT_GROWTH,
    RATIO_MAX_ULPS,
    accumulation_error,
    expected_error,
    rounding_floor,
    scale_excess,
    unit_roundoff,
)

#: the factor by which a correct module may grow the relative scale error of its inputs:
#: a product of two inputs that each carry a scale 1+d (q.k, gate*up) carries ~1+2d
BIAS_GROWTH = PRODUCT_GROWTH
#: levels whose metrics carry a scale with its standard error (full tensors, a sample):
#: those of :class:`~precguard.compare.levels.MeasuredMetrics`
SCALED_LEVELS = frozenset(
    level for level, cls in METRICS_LEVELS.items() if issubclass(cls, MeasuredMetrics)
)
#: module types linear in their one input (y = W x): an input scaled by s_in gives an
#: output scaled by s_in times the weights' scale, so the module's own scale is s_out/s_in
LINEAR_TYPES = frozenset({"Linear", "NonDynamicallyQuantizableLinear", "Conv1D", "LoRALinear"})
#: normalizations whose output ``w * x / rms(x)`` does not depend on the scale of their
#: input (with one parameter, the weight, they are linear in it)
SCALE_INVARIANT_TYPES = frozenset(
    {"RMSNorm", "LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "T5LayerNorm", "LayerNorm"}
)


def carried_bias(inputs: list[Metrics], profile: Profile) -> float:
    """The largest scale error the inputs may carry: |s - 1| plus ``bias_z`` standard errors,
    at most the relative L2 error (Cauchy-Schwarz; a sample's upper bound) of one whose
    scale was not measured, infinite when one differs and neither was measured."""
    carried = 0.0
    for m in inputs:
        if not isinstance(m, MeasuredMetrics) or m.scale is None or not math.isfinite(m.scale):
            if m.nan_mismatch or m.inf_mismatch:
                return math.inf
            if isinstance(m, MeasuredMetrics) and math.isfinite(m.error):
                carried = max(carried, sampled_bounds(m, profile.bias_z)[1][0])
            elif m.error > 0:
                return math.inf
            continue
        carried = max(carried, abs(m.scale - 1.0) + profile.bias_z * (m.scale_se or 0.0))
    return carried


def scale_floor(dtype: str, k: int | None, profile: Profile, linear: bool = False) -> float:
    """The scale error a correct module may carry beyond ``bias_z`` standard errors:
    ``profile.bias_floor`` when set (``--rtol``), else the accumulation part of
    :func:`rounding_floor` plus, unless the record is ``linear`` in what it consumed,
    ``bias_floor_ulps`` unit roundoffs of ``dtype`` (a broadcast statistic rounded to
    ``dtype`` shifts every element alike: docs/compare.md, "Systematic bias")."""
    if profile.bias_floor is not None:
        return profile.bias_floor
    acc = accumulation_error(k, dtype)
    return acc + (0.0 if linear else profile.bias_floor_ulps * unit_roundoff(dtype))


def linear_factors(
    module_type: str, phase: str, role: str, index: int, consumed: list[Any]
) -> list[MeasuredMetrics] | None:
    """The consumed records (:class:`~precguard.compare.report.RecordResult`) a produced
    record is linear in, or None; its own scale is then ``s / prod(s_f)``.

    A ``Linear``'s output ``W x`` is linear in its input and weight, its input gradient
    ``g W`` in ``g`` and the weight, its weight gradient ``g^T x`` in ``g`` and ``x``, its
    bias gradient in ``g``; a normalization (:data:`SCALE_INVARIANT_TYPES`) with at most
    one parameter in its weight only. A weight counts by its scale alone. None when a
    factor's error is beyond :data:`RATIO_MAX_ULPS` unit roundoffs (docs/compare.md,
    "Systematic bias") or its scale was not measured and it is not exact.
    """
    kinds = (("forward", "input"), ("forward", "param"), ("backward", "output"))
    fin, params, gout = ([x for x in consumed if (x.phase, x.role) == kind] for kind in kinds)
    weight = [x for x in params if x.index == 0]
    if module_type in SCALE_INVARIANT_TYPES and phase == "forward" and role == "output":
        return _weights(params) if len(params) <= 1 else None
    if module_type not in LINEAR_TYPES:
        return None
    found, w = _linear_in(phase, role, index, fin, gout), _weights(weight)
    if role == "grad" and phase != "forward":
        w = []  # a parameter's gradient is not linear in the parameter
    if found is None or w is None:
        return None
    return [*found, *w]


def _linear_in(
    phase: str, role: str, index: int, fin: list[Any], gout: list[Any]
) -> list[MeasuredMetrics] | None:
    """The factors of a ``Linear``'s record besides its weight: its one input (forward
    output), its output gradient (input gradient), or for a weight's gradient ``g^T x``
    both, a bias's ``g`` alone."""
    if phase == "forward":
        return _scaled(fin) if role == "output" and len(fin) == 1 else None
    if len(gout) != 1 or role not in ("input", "grad"):
        return None
    if role == "input":
        return _scaled(gout)
    both = index == 0 and len(fin) == 1
    return _scaled([*fin, *gout] if both else gout)


def _scaled(records: list[Any]) -> list[MeasuredMetrics] | None:
    """The metrics of ``records`` as scale factors, or None when one differs by more than
    rounding (it may be structured: :func:`linear_factors`) or by an unknown scale."""
    out = []
    for x in records:
        m = x.metrics
        if m is None:
            return None
        if isinstance(m, MeasuredMetrics) and m.scale is not None and m.scale:
            if m.error > RATIO_MAX_ULPS * unit_roundoff(m.dtype):
                return None  # an error beyond rounding may be structured
            out.append(m)
        elif m.error > 0 or m.nan_mismatch or m.inf_mismatch:
            return None  # it differs, by an unknown scale
    return out


def _weights(records: list[Any]) -> list[MeasuredMetrics] | None:
    """Weights as factors by their scale only: their rounding reaches the output as a
    pattern shared along its channels, which the output's own standard error measures."""
    out = _scaled(records)
    return None if out is None else [m.model_copy(update={"scale_se": 0.0}) for m in out]


def own_scale(
    output: MeasuredMetrics,
    factors: list[MeasuredMetrics],
    profile: Profile,
    k: int | None = None,
    linear: bool = True,
) -> float | None:
    """The scale error of its own that ``output``, linear in each of ``factors``, shows.

    Its own scale ``s_out / prod(s_f)`` must differ from 1 by more than ``bias_z``
    standard errors (added in quadrature) plus :func:`scale_floor`; ``linear`` False (a
    normalization) keeps the one-ulp part of the floor. Returns that excess, or None.
    """
    if output.scale is None or output.scale_se is None:
        return None
    ratio = output.scale
    var = output.scale_se**2
    for f in factors:
        assert f.scale is not None
        ratio /= f.scale
        var += (f.scale_se or 0.0) ** 2
    excess = scale_excess(ratio, math.sqrt(var), profile.bias_z)
    floor = scale_floor(output.dtype, k, profile, linear=linear)
    return excess if excess > floor else None


def significant_scale(m: Metrics, profile: Profile) -> bool:
    """Whether ``m``'s scale differs from 1 by more than ``bias_z`` standard errors (the
    test before any floor, :func:`scale_floor`)."""
    if not isinstance(m, MeasuredMetrics):
        return False
    return scale_excess(m.scale, m.scale_se, profile.bias_z) > 0.0


def own_bias(
    output: Metrics,
    profile: Profile,
    *,
    input_error: float,
    carried: float,
    k: int | None = None,
    factors: list[MeasuredMetrics] | None = None,
    module_type: str = "",
    param: bool = False,
) -> float | None:
    """The scale error ``output`` shows beyond what it consumed explains, or None.

    The one test of "this scale error is the module's own", for the judge (per record)
    and for divergence (per call); only for a significant scale
    (:func:`significant_scale`) whose consumed records are within
    :data:`BIAS_MAX_INPUT_ERROR` (``input_error``, their largest error). With
    ``factors`` (:func:`linear_factors`) by :func:`own_scale`; otherwise its excess must
    pass :func:`scale_floor` and :data:`BIAS_GROWTH` times ``carried``
    (:func:`carried_bias`). A ``param``'s is its own only when nothing carried error in.
    """
    if not isinstance(output, MeasuredMetrics) or not significant_scale(output, profile):
        return None
    if input_error > BIAS_MAX_INPUT_ERROR:
        return None
    if factors is not None:
        return own_scale(output, factors, profile, k, linear=module_type in LINEAR_TYPES)
    assert output.scale is not None
    excess = scale_excess(output.scale, output.scale_se or 0.0, profile.bias_z)
    floor = scale_floor(output.dtype, k, profile)
    if param:
        return excess if input_error == 0.0 and excess > floor else None
    return excess if excess > max(BIAS_GROWTH * carried, floor) else None


__all__ = [
    "BIAS_GROWTH",
    "BIAS_MAX_INPUT_ERROR",
    "LINEAR_TYPES",
    "SCALED_LEVELS",
    "carried_bias",
    "expected_error",
    "linear_factors",
    "own_bias",
    "own_scale",
    "rounding_floor",
    "scale_floor",
    "significant_scale",
]
