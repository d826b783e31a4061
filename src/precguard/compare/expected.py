"""The error a module's precision explains, and the systematic error it cannot.

Compare calls a module *local* only when its output error is significantly
beyond what its compute precision explains given its inputs' error. Two
sources (docs/compare.md cites them):

- **Rounding floor.** With exact inputs, a correctly computed output in a
  precision with unit roundoff ``u`` differs from the exact result by its own
  rounding (at most ``u`` relative per element) plus the accumulation error of
  its dot products. For a sum of ``K`` products accumulated with unit roundoff
  ``u_acc`` the worst-case bound is ``gamma_K = K u_acc / (1 - K u_acc)``
  (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., §3.1);
  the bound that holds with high probability for rounding errors of random
  sign is ``~sqrt(K) u_acc`` (Higham & Mary, SIAM J. Sci. Comput. 41(5), 2019),
  which is what two correct kernels differ by. Accelerators store bf16/fp16
  and accumulate in fp32 (DESIGN.md), so ``u_acc`` is fp32's unless the
  tolerance dtype is more precise. ``K`` is the last dimension of the call's
  inputs (the reduced dimension of a Linear).
- **Propagated error.** A correct module passes its inputs' relative error on,
  grown by at most a small factor; the floor is the input error itself.

The expected error is ``max(input error, rounding floor)``; a module is local
when it at least doubles that with inputs in tolerance, or grows it by the
profile's ``amplification`` otherwise (see :mod:`precguard.compare.divergence`).

A systematic (scale) error hides inside rounding noise element by element but
not in aggregate: :func:`own_bias` is the part of an output's scale error that
its inputs' scale errors cannot explain.
"""

from __future__ import annotations

import math

from precguard.compare.report import Metrics
from precguard.compare.tolerance import Profile, unit_roundoff

#: the factor by which a correct module may grow the relative scale error of its inputs:
#: a product of two inputs that each carry a scale 1+d (q.k, gate*up) carries ~1+2d
BIAS_GROWTH = 2.0
#: a scale is read as a perturbation of golden only while every input is this close to
#: golden (relative L2 error); beyond it the runs compute different things altogether
#: (other input data) and a scale ratio says nothing about the module
BIAS_MAX_INPUT_ERROR = 0.25
#: module types linear in their one input (y = W x): an input scaled by s_in gives an
#: output scaled by s_in times the weights' scale, so the module's own scale is s_out/s_in
LINEAR_TYPES = frozenset({"Linear", "NonDynamicallyQuantizableLinear", "Conv1D", "LoRALinear"})


def rounding_floor(dtype: str, k: int | None = None) -> float:
    """Relative error a correct output in ``dtype`` carries when its inputs are exact.

    One rounding to ``dtype`` plus the probabilistic accumulation error
    ``sqrt(k) * u_acc`` of dot products of length ``k`` (``u_acc``: fp32's, or
    ``dtype``'s when that is more precise).

    >>> rounding_floor("bfloat16") == 2.0**-8
    True
    """
    u = unit_roundoff(dtype)
    u_acc = min(u, unit_roundoff("float32"))
    return u + (math.sqrt(k) * u_acc if k and k > 1 else 0.0)


def expected_error(input_error: float, dtype: str, k: int | None = None) -> float:
    """The output error a correct module explains: its inputs' error or its rounding floor."""
    return max(input_error, rounding_floor(dtype, k))


def carried_bias(inputs: list[Metrics], profile: Profile) -> float:
    """The largest scale error the inputs may carry: |s - 1| plus ``bias_z`` standard errors.

    Infinite when an input differs but its scale was not measured (integer ids,
    statistics only, a shape mismatch): nothing can then be said to be the
    module's own.
    """
    carried = 0.0
    for m in inputs:
        if m.scale is None or not math.isfinite(m.scale):
            if m.error > 0 or m.nan_mismatch or m.inf_mismatch:
                return math.inf
            continue
        carried = max(carried, abs(m.scale - 1.0) + profile.bias_z * (m.scale_se or 0.0))
    return carried


def own_bias(
    output: Metrics,
    inputs: list[Metrics],
    profile: Profile,
    module_type: str = "",
    k: int | None = None,
) -> float | None:
    """The scale error ``output`` shows beyond what ``inputs`` explain, or None.

    Only for an output whose bias is significant (``output.bias``) and inputs within
    :data:`BIAS_MAX_INPUT_ERROR` of golden. For a module
    linear in its one float input (:data:`LINEAR_TYPES`) its own scale is
    ``s_out / s_in``, which must differ from 1 by more than ``bias_z`` combined
    standard errors plus the profile's bias floor (in units of :func:`rounding_floor` of
    the output's dtype and the reduction length ``k``). For any other module, its
    |s - 1| less ``bias_z`` standard errors must exceed :data:`BIAS_GROWTH` times
    the largest scale error an input carries (:func:`carried_bias`).
    """
    if not output.bias or output.scale is None:
        return None
    if any(m.error > BIAS_MAX_INPUT_ERROR for m in inputs):
        return None
    scaled = [m for m in inputs if m.scale is not None and m.level == "full"]
    if module_type in LINEAR_TYPES and len(scaled) == 1 and scaled[0].scale:
        (inp,) = scaled
        assert inp.scale is not None
        ratio = output.scale / inp.scale
        se = math.hypot(output.scale_se or 0.0, inp.scale_se or 0.0)
        excess = abs(ratio - 1.0) - profile.bias_z * se
        floor = profile.bias_floor
        if floor is None:  # a reduction of length k in another order may shift it as much
            floor = profile.bias_floor_ulps * rounding_floor(output.dtype, k)
        return excess if excess > floor else None
    excess = abs(output.scale - 1.0) - profile.bias_z * (output.scale_se or 0.0)
    if excess > BIAS_GROWTH * carried_bias(inputs, profile):
        return excess
    return None
