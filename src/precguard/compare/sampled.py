"""What a statistics-only pair's sampled elements and per-position norms say, heavy tails included.

A statistics-mode record keeps 128 sampled elements and the L2 norm of every position
(:mod:`precguard.capture.evidence`). A trained model's tensors are heavy-tailed, so each
measure here is taken against the scale of the elements it was measured on, never
against a scale the sample did not see: the relative error against the larger of the
sample's norm and the tensor's rms, the peak error against the sample's largest value,
a position's norm difference against the typical position's (:data:`SLICE_FLOOR`), and
a scale with its standard error (:func:`sample_scale`). See docs/compare.md, "Evidence
in statistics-mode records" and "Sampling uncertainty".
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from precguard.compare.levels import Metrics, StatsMetrics, concentrated
from precguard.dump.schema import Record
from precguard.numerics import BIAS_Z, RARE_COUNT, SLICE_FLOOR

#: a sample's scale is estimated only when more than this many of its elements carry
#: its norm (``n_eff = (sum g^2)^2 / sum g^4``): the ratio ``<g, d> / <g, g>`` is bounded
#: at ``z`` standard errors only while its denominator is (docs/compare.md)
MIN_EFFECTIVE = BIAS_Z * BIAS_Z
#: sampled element errors kept in decreasing order (``sample_peaks``): enough to tell
#: how many of them carry the peak (:data:`RARE_COUNT`)
PEAKS_KEPT = 16


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

    The standard error is the larger of the heteroskedasticity-robust one (each element
    its own cluster) and ``rho / sqrt(n_eff)``, what independent errors of the sample's
    own residual size ``rho`` predict (the robust estimate can fall below it when a few
    elements hold most of the norm). None when fewer than :data:`MIN_EFFECTIVE` elements
    carry the sample's norm.
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
    if n_eff <= MIN_EFFECTIVE:
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
    if g.size == 0:  # every sampled element a mask's stand-in (or not finite)
        if mask_floor > -math.inf:
            return {"sample_size": 0, "sample_rel_l2": 0.0, "sample_max_abs": 0.0}, 0.0
        return {}, None
    d = a - g
    n = d.size
    err = math.sqrt(float(np.dot(d, d)))
    den = max(math.sqrt(float(np.dot(g, g))), math.sqrt(n) * rms)
    rel = err / den if den > 0 else (0.0 if err == 0 else math.inf)
    abs_d = np.abs(d)
    max_abs = float(abs_d.max())
    top = float(np.abs(g).max())
    peak = max_abs / top if top > 0 else (0.0 if max_abs == 0 else None)
    out: dict[str, Any] = {"sample_size": n, "sample_rel_l2": rel, "sample_max_abs": max_abs}
    numel = golden.stats.numel if golden.stats is not None else None
    out["sample_rse"] = mean_square_rse(d, numel)
    if top > 0:
        largest = np.sort(abs_d)[::-1][:PEAKS_KEPT] / top
        out["sample_peaks"] = [float(x) for x in largest]
    scaled = sample_scale(g, a) if mask_floor == -math.inf else None
    if scaled is not None:
        out["scale"], out["scale_se"] = scaled
    return out, peak


def mean_square_rse(d: np.ndarray, numel: int | None) -> float:
    """Relative standard error of a sample's mean squared error as an estimate of the
    tensor's: ``sqrt(n / (n - 1) * (1 / n_eff - 1 / n) * (1 - n / numel))``, ``n_eff =
    (sum x)^2 / sum x^2`` of the squared errors ``x`` (the finite-population factor makes
    a fully sampled tensor's estimate exact, 0).
    """
    n = d.size
    x = d * d
    total = float(x.sum())
    if total == 0 or n >= (numel or math.inf):
        return 0.0
    if n < 2 or not math.isfinite(total):
        return math.inf
    inv_eff = float(np.dot(x, x)) / (total * total)
    fpc = 1.0 - n / numel if numel else 1.0
    return math.sqrt(max(0.0, n / (n - 1) * (inv_eff - 1.0 / n) * fpc))


def sampled_bounds(m: Metrics, z: float) -> tuple[tuple[float, float], tuple[float, float]]:
    """A statistics-only record's (global, concentrated) error, as lower and upper bounds.

    ``((low, low_conc), (high, high_conc))`` at ``z`` standard errors of the sample
    (:func:`mean_square_rse`), never below what the norms prove; the concentrated
    lower bound takes the :data:`RARE_COUNT`-th largest sampled element error, the
    upper the largest (docs/compare.md, "Sampling uncertainty"). Any other record:
    its measured errors.
    """
    e = m.error if math.isfinite(m.error) else math.inf
    conc = max(x for x in (e, *concentrated(m)) if x is not None)
    if not isinstance(m, StatsMetrics) or m.sample_rel_l2 is None or m.sample_rse is None:
        return (e, conc), (e, conc)
    if not math.isfinite(z):  # the profile asks for no statistical test (bias_z inf)
        return (e, conc), (e, conc)
    proven = max(m.pos_rel_l2 or 0.0, (m.stat_rel_diff or {}).get("l2", 0.0))
    spread = z * m.sample_rse
    low = max(proven, m.sample_rel_l2 * math.sqrt(max(0.0, 1.0 - spread)))
    # a sample of one element has no spread to measure: its estimate is all it says
    grown = math.sqrt(1.0 + spread) if math.isfinite(spread) else 1.0
    high = max(proven, m.sample_rel_l2 * grown)
    peaks = m.sample_peaks or []
    exact = m.sample_rse == 0.0  # every element sampled, or no sampled element differs
    k = RARE_COUNT
    peak_low = m.peak_error if exact else (peaks[k - 1] if len(peaks) >= k else 0.0)
    low_conc = max(x for x in (low, m.slice_error, peak_low) if x is not None)
    high_conc = max(x for x in (high, conc) if x is not None)
    return (low, low_conc), (high, high_conc)


def position_evidence(golden: Record, actual: Record) -> dict[str, float | int]:
    """The ``pos_*`` metrics of two records' per-position norms (else nothing): per bin
    ``|n_a - n_g| / max(n_g, SLICE_FLOOR rms(n_g))``, its largest where an error along
    the sequence sits, and ``pos_rel_l2 = ||n_a - n_g|| / ||n_g||``, a lower bound of the
    tensor's rel_l2."""
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
