"""Judging two sides' next-token distributions: near-tie or divergence, KL, top-k overlap.

A flip is a **near-tie** when the compute precision explains it: both tokens' margins
are within :data:`~precguard.numerics.Z_SCORE` standard deviations of the difference of
two logits, and the logits as a whole within the explained error
(:func:`precguard.numerics.stacked_floor`; docs/generate.md, "Near-tie or divergence").
"""

from __future__ import annotations

import math

import torch

from precguard.numerics import LOGITS_SLACK, Z_SCORE, measure


def rms(x: torch.Tensor) -> float:
    """Root mean square of the finite elements of ``x``."""
    finite = x[torch.isfinite(x)].double()
    return float(finite.pow(2).mean().sqrt()) if finite.numel() else 0.0


def rel_l2(actual: torch.Tensor, golden: torch.Tensor) -> float | None:
    """||a - g|| / ||g|| (:func:`precguard.numerics.measure`), or None when either side
    holds a non-finite value (a step's logits with NaN/Inf are no distribution to be near)."""
    m = measure(actual, golden)
    return m.rel_l2 if m.finite else None


def kl_divergence(
    golden: torch.Tensor, actual: torch.Tensor, temperature: float = 1.0
) -> float | None:
    """KL(p_golden || p_actual) of the softmax distributions, in nats.

    Infinite when either side's logits are not finite: such a step must not drop out
    of a mean KL that would then read as tiny.
    """
    if not (torch.isfinite(golden).all() and torch.isfinite(actual).all()):
        return math.inf
    lg = torch.log_softmax(golden.double() / temperature, dim=-1)
    la = torch.log_softmax(actual.double() / temperature, dim=-1)
    return max(float((lg.exp() * (lg - la)).sum()), 0.0)


def top_k_overlap(golden: torch.Tensor, actual: torch.Tensor, k: int) -> float:
    """Share of the golden's top-k token ids that are also in the actual's top-k."""
    k = min(k, golden.numel())
    g = set(torch.topk(torch.nan_to_num(golden, nan=-math.inf), k).indices.tolist())
    a = set(torch.topk(torch.nan_to_num(actual, nan=-math.inf), k).indices.tolist())
    return len(g & a) / k


def gap(scores: torch.Tensor, mine: int, other: int) -> float | None:
    """scores[mine] - scores[other], None when non-finite."""
    value = float(scores[mine]) - float(scores[other])
    return value if math.isfinite(value) else None


def judge_flip(
    golden: torch.Tensor,
    actual: torch.Tensor,
    golden_token: int,
    actual_token: int,
    *,
    explained: float,
    temperature: float = 1.0,
    golden_noise: torch.Tensor | None = None,
) -> dict[str, object]:
    """Decide whether a flip at one step is a near-tie or a divergence.

    ``golden``/``actual`` are the two sides' logits at the step; with sampling
    ``golden_noise`` is the shared Gumbel noise (scores are logits / T + noise,
    whose error is the logits' divided by T).
    Returns the fields of :class:`~precguard.generation.report.TokenDivergence`
    that judge it.
    """

    def scores(logits: torch.Tensor) -> torch.Tensor:
        return logits if golden_noise is None else logits / temperature + golden_noise

    scale = rms(golden) / (temperature if golden_noise is not None else 1.0)
    tolerance = Z_SCORE * math.sqrt(2.0) * explained * scale  # a difference of two: sqrt(2) x
    g_margin = gap(scores(golden), golden_token, actual_token)
    a_margin = gap(scores(actual), actual_token, golden_token)
    error = rel_l2(actual, golden)
    if g_margin is None or a_margin is None or error is None:
        kind, reason = "divergence", "the actual's logits are not finite at this step"
    elif error > LOGITS_SLACK * explained:
        kind = "divergence"
        reason = (
            f"the logits differ by {error:.3g} (relative L2), more than {LOGITS_SLACK:g}x the "
            f"{explained:.3g} the compute precision explains"
        )
    elif g_margin <= tolerance and a_margin <= tolerance:
        kind = "near-tie"
        reason = (
            f"the two tokens are {g_margin:.3g} apart on the golden and {a_margin:.3g} on the "
            f"actual, within the {tolerance:.3g} rounding explains"
        )
    else:
        kind = "divergence"
        reason = (
            f"the golden prefers its token by {g_margin:.3g} and the actual its own by "
            f"{a_margin:.3g}; rounding explains {tolerance:.3g}"
        )
    return {
        "golden_margin": g_margin,
        "actual_margin": a_margin,
        "tolerance": tolerance,
        "logits_error": error,
        "explained_error": explained,
        "kind": kind,
        "reason": reason,
    }
