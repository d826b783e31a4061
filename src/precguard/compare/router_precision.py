"""A router's weights recomputed from its own logits: the precision the gate computed in.

Reference code keeps a router's arithmetic in float32 inside a low-precision model; a
device that computes those ops in bf16 errs by one bf16 rounding, which the error of
its inputs explains. The router records its logits, its indices and its weights, and
the weights are a fixed function of the other two (one of :data:`FORMS`, times a
constant scale): the form and scale that give the golden's weights, applied in float64
to the actual's logits and indices, leave a residual that is the rounding of the
actual's own arithmetic alone. A precision class
(:func:`precguard.numerics.precision_class`) coarser than the precision the weights
were asked for is a finding at the router (docs/compare.md, "Mixture of experts").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

from precguard.numerics import (
    PRECISION_CLASSES,
    SIGNIFICAND_BITS,
    precision_class,
    relative_l2,
    unit_roundoff,
)

if TYPE_CHECKING:
    import torch

    #: a form: (logits as float64 [tokens, experts], indices [tokens, k]) -> unscaled weights
    Form = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

#: how the reason for a router computing below its precision begins (compare/routing.py
#: tells its finding by it)
LOWERED = "its routing weights are not what its own logits give"


def _normalized(w: torch.Tensor) -> torch.Tensor:
    return w / w.sum(dim=-1, keepdim=True)


#: the routers' weight forms, by name (the name is said in the finding); tensor methods,
#: the same kernels as torch.softmax and torch.sigmoid (this module imports no torch)
FORMS: dict[str, Form] = {
    "softmax over every expert": lambda lg, idx: lg.softmax(dim=-1).gather(1, idx),
    "softmax over the chosen": lambda lg, idx: lg.gather(1, idx).softmax(dim=-1),
    "sigmoid": lambda lg, idx: lg.sigmoid().gather(1, idx),
    "normalized sigmoid": lambda lg, idx: _normalized(lg.sigmoid().gather(1, idx)),
}


def _residual(weights: torch.Tensor, fitted: torch.Tensor) -> float:
    return relative_l2(float((weights - fitted).norm()), float(weights.norm()))


def fit_form(
    logits: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor
) -> tuple[str, float, float] | None:
    """The form and scale that give ``weights`` from ``logits`` and ``idx`` (float64, rows
    of tokens), with the relative residual: the best of :data:`FORMS`, None when none is
    defined (non-finite values, a zero candidate)."""
    import torch

    best: tuple[str, float, float] | None = None
    for name, form in FORMS.items():
        cand = form(logits, idx)
        denom = float((cand * cand).sum())
        if denom <= 0 or not torch.isfinite(cand).all():
            continue
        scale = float((weights * cand).sum()) / denom
        res = _residual(weights, scale * cand)
        if best is None or res < best[2]:
            best = (name, scale, res)
    return best


def coarser(found: str, asked: str) -> bool:
    """Whether the precision class ``found`` is coarser than the dtype ``asked``."""
    if found not in PRECISION_CLASSES:
        return True  # below bfloat16
    return unit_roundoff(found) > unit_roundoff(asked)


def lowered_weights(
    golden: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    actual: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    asked: tuple[str, str],
    rows: torch.Tensor | None = None,
) -> str | None:
    """Why the actual router computed its weights below the precision asked: "" when it
    did not, None when this cannot be told (no form gives the golden's weights within its
    own precision). ``golden`` and ``actual``: (logits ``[tokens, experts]``, indices and
    weights ``[tokens, k]``); ``asked``: the precision each side's weights were asked for;
    ``rows``: the tokens both runs routed alike (all when None).
    """
    if any(p not in SIGNIFICAND_BITS for p in asked):
        return None  # a precision with no unit roundoff to compare with
    g_lg, g_idx, g_w = (t.double() for t in golden)
    a_lg, a_idx, a_w = (t.double() for t in actual)
    if rows is not None:
        g_lg, g_idx, g_w = g_lg[rows], g_idx[rows], g_w[rows]
        a_lg, a_idx, a_w = a_lg[rows], a_idx[rows], a_w[rows]
    if g_idx.numel() == 0:
        return None
    g_idx, a_idx = g_idx.long(), a_idx.long()
    fit = fit_form(g_lg, g_idx, g_w)
    if fit is None:
        return None
    name, scale, g_res = fit
    if coarser(precision_class(g_res), asked[0]):
        return None  # not a form the golden computes (or its own precision is lower)
    a_res = _residual(a_w, scale * FORMS[name](a_lg, a_idx))
    if not math.isfinite(a_res):
        return None  # non-finite values: a finding of their own, not a precision
    found = precision_class(a_res)
    if not coarser(found, asked[1]):
        return ""
    if found not in PRECISION_CLASSES:
        found = "less than bfloat16"
    return (
        f"{LOWERED} in {asked[1]} (recomputed as the {name} of its logits, x {scale:.4g}, on "
        f"the {g_idx.shape[0]} tokens both runs routed alike, they differ by {a_res:.3g}, a "
        f"{found} rounding; the golden's by {g_res:.3g}): it computed in {found} where its "
        f"code keeps {asked[1]}; compute the router in {asked[1]}"
    )
