"""What a statistics-only pair's sampled elements and per-position norms say, heavy tails included.

A statistics-mode record keeps 128 elements at indices chosen from the shape
and the L2 norm of every position (:mod:`precguard.capture.evidence`). A
trained model's tensors are heavy-tailed — an attention-sink head whose value
channel holds ~1e5 among values of ~1, a residual stream whose mean is several
times its spread, peaked logits — so each measure here is taken against the
scale of the elements it was measured on, never against a scale the sample did
not see (docs/compare.md, "Evidence in statistics-mode records"):

- **relative error** ``||a_s - g_s|| / max(||g_s||, sqrt(n_s) rms(g))``: the
  sample's own norm when it over-represents the tail (one sampled outlier then
  dominates numerator and denominator alike, and the ratio is the relative
  error, not ``u * 1e5`` over the bulk's rms); the tensor's rms (from its
  statistics) otherwise.
- **peak error** ``max|a_s - g_s| / max|g_s|``: the sample's largest error
  against the sample's own largest value, as the full level's ``max_abs /
  max|g|`` is one tensor's (an outlier the sample missed does not make every
  sampled error look small, nor a sampled outlier every error look large).
- **worst position**: ``|n_a - n_g| / max(n_g, SLICE_FLOOR rms(n_g))``, the
  full level's slice floor: a position whose norm is a tenth of the typical
  position's (the sink's first token after a LayerNorm, a causal first
  position) carries its share of the tensor's absolute error and is judged
  against the typical norm, not its own near-zero one.
- **scale** ``s = <g_s, a_s> / <g_s, g_s>`` with its standard error
  (:func:`sample_scale`), so a systematic error of a few percent is seen from
  the sample alone.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from precguard.dump.schema import Record

#: a sample's scale is estimated only when at least this many of its elements carry
#: its norm (effective count ``(sum g^2)^2 / sum g^4``): the standard error is itself
#: estimated from the sample, within ~1/sqrt(2 n_eff) relative (18 % at 16); a sample
#: that one sampled outlier dominates says nothing about the rest of the tensor
MIN_EFFECTIVE = 16
#: a slice's relative error is taken against at least this share of rms(golden) per
#: element, so a slice of near-zero golden values (a causal first position, a dead
#: channel) does not read as a concentrated error; the full level's slices
#: (:func:`precguard.compare.metrics.full_metrics`) and the per-position norms alike
SLICE_FLOOR = 0.1


def _pairs(
    golden: Record, actual: Record, mask_floor: float
) -> tuple[np.ndarray, np.ndarray] | None:
    """The sampled elements finite on both sides (a mask's stand-ins left out)."""
    gs, as_ = golden.sample, actual.sample
    if gs is None or as_ is None or gs.seed != as_.seed:
        return None
    g, a = gs.array(), as_.array()
    if g.size != a.size or g.size == 0:
        return None
    if mask_floor > -math.inf:
        stand_in = (g <= mask_floor) & (a <= mask_floor)
        g, a = g[~stand_in], a[~stand_in]
    both = np.isfinite(g) & np.isfinite(a)
    return g[both], a[both]


def sample_scale(g: np.ndarray, a: np.ndarray) -> tuple[float, float] | None:
    """Least-squares scale of ``a`` on ``g`` over a sample, and its standard error.

    ``s - 1 = sum g_i d_i / sum g_i^2`` (``d = a - g``). Its standard error is the
    larger of two estimates:

    - the heteroskedasticity-robust one, each element its own cluster:
      ``sqrt(n/(n-1) sum (g_i (d_i - (s-1) g_i))^2) / sum g_i^2``;
    - what independent errors of the sample's own residual size predict:
      ``rho / sqrt(n_eff)`` with ``rho = ||d - (s-1) g|| / ||g||`` and ``n_eff =
      (sum g^2)^2 / sum g^4``, the sample's effective count. With relative errors
      ``delta_i`` of spread ``rho``, ``Var(s) = rho^2 sum g^4 / (sum g^2)^2``; with
      absolute errors it is ``rho^2 / n``, smaller (``n_eff <= n``). The robust
      estimate can fall below it when a few elements hold most of the norm.

    For bf16 rounding alone (``delta`` uniform within ``u = 2^-8``, spread
    ``u / sqrt(3)``) and 128 Gaussian values (``n_eff ~ n / 3 ~ 43``) the standard error
    is ``0.00226 / 6.5 ~ 3.5e-4``; behind inputs that already differ by 2 % it is
    ~0.003. A 3 % scale is then ten standard errors. None when fewer than
    :data:`MIN_EFFECTIVE` elements carry the sample's norm.
    """
    n = g.size
    if n < 2:
        return None
    g2 = g * g
    gg = float(g2.sum())
    g4 = float(np.dot(g2, g2))
    if not (gg > 0 and math.isfinite(gg) and g4 > 0 and math.isfinite(g4)):
        return None
    n_eff = gg * gg / g4
    if n_eff < MIN_EFFECTIVE:
        return None
    d = a - g
    bias = float(np.dot(g, d)) / gg
    resid = d - bias * g
    robust = math.sqrt(n / (n - 1) * float(np.dot(g2, resid * resid))) / gg
    rho = math.sqrt(float(np.dot(resid, resid)) / gg)
    return 1.0 + bias, max(robust, rho / math.sqrt(n_eff))


def sample_evidence(
    golden: Record, actual: Record, rms: float, *, mask_floor: float = -math.inf
) -> tuple[dict[str, Any], float | None]:
    """The ``sample_*`` and ``scale`` fields of two records' samples, and the peak error.

    ``rms`` is the golden's rms from its full statistics (0: unknown, or dominated by
    a mask's stand-ins, which ``mask_floor`` leaves out of the sample). Returns
    ``({}, None)`` when the records keep no common sample. The peak error is the
    sample's largest error over its largest golden value (module docstring).
    """
    pairs = _pairs(golden, actual, mask_floor)
    if pairs is None:
        return {}, None
    g, a = pairs
    if g.size == 0:
        if actual.sample is not None and golden.sample is not None and mask_floor > -math.inf:
            return {"sample_size": 0, "sample_rel_l2": 0.0, "sample_max_abs": 0.0}, 0.0
        return {}, None
    d = a - g
    n = d.size
    err = math.sqrt(float(np.dot(d, d)))
    den = max(math.sqrt(float(np.dot(g, g))), math.sqrt(n) * rms)
    rel = err / den if den > 0 else (0.0 if err == 0 else math.inf)
    max_abs = float(np.abs(d).max())
    top = float(np.abs(g).max())
    peak = max_abs / top if top > 0 else (0.0 if max_abs == 0 else None)
    out: dict[str, Any] = {"sample_size": n, "sample_rel_l2": rel, "sample_max_abs": max_abs}
    scaled = sample_scale(g, a) if mask_floor == -math.inf else None
    if scaled is not None:
        out["scale"], out["scale_se"] = scaled
    return out, peak


def position_evidence(golden: Record, actual: Record) -> dict[str, float | int]:
    """The ``pos_*`` metrics of two records' per-position norms (else nothing).

    Per bin of positions ``|n_a - n_g| / max(n_g, SLICE_FLOOR rms(n_g))``; its
    largest names where an error concentrated along the sequence sits. ``pos_rel_l2 =
    ||n_a - n_g|| / ||n_g||`` bounds the tensor's rel_l2 from below, since
    ``|‖a_t‖ - ‖g_t‖| <= ‖a_t - g_t‖`` for every position.
    """
    gp, ap = golden.positions, actual.positions
    if gp is None or ap is None or (gp.dim, gp.bin, gp.length) != (ap.dim, ap.bin, ap.length):
        return {}
    g, a = gp.array(), ap.array()
    if g.size != a.size or g.size == 0 or not (np.isfinite(g).all() and np.isfinite(a).all()):
        return {}
    d = np.abs(a - g)
    g_norm = float(np.sqrt(np.dot(g, g)))
    typical = g_norm / math.sqrt(g.size)
    floor = max(SLICE_FLOOR * typical, np.finfo(np.float64).tiny)
    rel = d / np.maximum(g, floor)
    worst = int(np.argmax(rel))
    err = float(np.sqrt(np.dot(d, d)))
    return {
        "pos_dim": gp.dim,
        "pos_bin": gp.bin,
        "pos_worst": worst * gp.bin,
        "pos_worst_err": float(rel[worst]),
        "pos_rel_l2": err / g_norm if g_norm > 0 else (0.0 if err == 0 else math.inf),
    }
