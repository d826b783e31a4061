"""Normalization modules at the input statistics norms fail on: rows with a large mean.

A norm computes a row's mean and spread. Centred rows (a random-init model's
residual stream) are easy; a trained model's residual stream has a mean several
times its spread, and a norm whose statistics are computed one-pass in low
precision, ``E[x^2] - E[x]^2``, cancels there. op-check runs a norm module on
its captured inputs *and* on the same rows re-centred to a mean of
:data:`MEAN_TO_SPREAD` times their spread, so the case shows whatever the target's
own batch looks like.

Why ``MEAN_TO_SPREAD = TOLERANCE_EPS`` (8): op-check allows ``8 eps = 16 u`` of the
compute dtype. A correct norm rounds the row mean once (at most ``u`` of it,
``M u`` of the spread for a mean ``M`` times the spread) and centres before
squaring: at ``M = 8`` that is ``8 u``, half the tolerance. The one-pass variance
rounds ``E[x^2]`` and ``E[x]^2``, each about ``M^2`` times the variance: up to
``2 M^2 u = 128 u`` of the variance, ``64 u`` of the scale, four times the
tolerance. One ratio separates the two on every dtype, derived from the tolerance
alone.
"""

from __future__ import annotations

import torch
from torch import nn

#: rows are re-centred to a mean this many times their spread (the module docstring; defined
#: with the tolerance it is derived from in :mod:`precguard.numerics`)
from precguard.numerics import MEAN_TO_SPREAD


def looks_like_norm(module: nn.Module) -> bool:
    """True for a normalization module: its class is named ``*Norm*`` (LayerNorm, RMSNorm…)."""
    return "norm" in type(module).__name__.lower()


def large_mean_label(ratio: float = MEAN_TO_SPREAD) -> str:
    """How the re-centred points are named in the results."""
    return f"mean {ratio:g}x spread"


def with_large_mean(
    args: tuple, kwargs: dict, ratio: float = MEAN_TO_SPREAD
) -> tuple[tuple, dict] | None:
    """``args`` with the first floating input's rows re-centred to ``ratio`` x their spread.

    Each row (the last dimension, what a norm normalizes) keeps its shape and
    spread; its mean becomes ``ratio`` times its standard deviation. None when the
    module takes no floating input with rows.
    """
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and a.is_floating_point() and a.dim() >= 1:
            x = a.double()
            centred = x - x.mean(-1, keepdim=True)
            spread = centred.pow(2).mean(-1, keepdim=True).sqrt()
            shifted = (centred + ratio * spread).to(a.dtype)
            return (*args[:i], shifted, *args[i + 1 :]), kwargs
    return None
