"""``reduce.order_sensitivity`` on a multi-rank recording: order noise or a wrong reduction?

An all-reduce adds one tensor per rank; NCCL, gloo and HCCL add them in
different orders (ring, tree, by chunk), and every order rounds differently.
Given the full tensors a recording saved for a reducing collective's inputs on
every rank of its group and its output, this module

* sums the inputs exactly (fp64) and in several orders in the collective's
  dtype (every permutation of the ranks for small groups, a sample for large
  ones, plus a pairwise tree), which measures the *order noise*;
* bounds the error any order may make: summing n terms in a dtype with unit
  roundoff u is off by at most (n-1)·u·Σ|x_r| per element (Higham, Accuracy
  and Stability of Numerical Algorithms, §4.2, to first order), so an output
  beyond that bound is not order noise but a reduction that is not the
  math (a dropped rank, a stale buffer, a reduced copy, wrong scaling).
"""

from __future__ import annotations

import itertools
import math
import random

import torch

from precguard.numerics import unit_roundoff

#: at most this many summation orders are tried (all permutations of small groups)
MAX_ORDERS = 24


def _orders(n: int, seed: int = 0) -> list[list[int]]:
    if math.factorial(n) <= MAX_ORDERS:
        return [list(p) for p in itertools.permutations(range(n))]
    rng = random.Random(seed)
    out = [list(range(n)), list(reversed(range(n)))]
    while len(out) < MAX_ORDERS:
        perm = list(range(n))
        rng.shuffle(perm)
        out.append(perm)
    return out


def _sum_in_order(parts: list[torch.Tensor], order: list[int]) -> torch.Tensor:
    acc = parts[order[0]].clone()
    for i in order[1:]:
        acc = acc + parts[i]  # rounded to the dtype at every step, as a collective does
    return acc


def _tree_sum(parts: list[torch.Tensor]) -> torch.Tensor:
    level = list(parts)
    while len(level) > 1:
        level = [
            level[i] + level[i + 1] if i + 1 < len(level) else level[i]
            for i in range(0, len(level), 2)
        ]
    return level[0]


def reduction_spread(
    inputs: list[torch.Tensor], outputs: list[torch.Tensor], reduce_op: str | None
) -> tuple[int, float, float, float] | None:
    """``(orders tried, order noise, error, bound ratio)`` of a sum/avg all-reduce.

    :param inputs: each rank's input, in group order (same shape and dtype).
    :param outputs: each rank's output (the reduction as that rank received it).
    :param reduce_op: ``"sum"`` or ``"avg"``; anything else returns None (max/min
        have no order to speak of, and other ops are not sums).

    Noise and error are max-abs differences relative to the largest exact
    element; the bound ratio is per element (see the module doc).
    """
    if reduce_op not in ("sum", "avg") or len(inputs) < 2 or not inputs[0].is_floating_point():
        return None
    n = len(inputs)
    exact = torch.stack([x.double() for x in inputs]).sum(0)
    magnitude = torch.stack([x.double().abs() for x in inputs]).sum(0)
    if reduce_op == "avg":
        exact, magnitude = exact / n, magnitude / n
    scale = float(exact.abs().max()) or 1.0
    orders = _orders(n)
    sums = [_sum_in_order(inputs, o) for o in orders] + [_tree_sum(inputs)]
    if reduce_op == "avg":
        sums = [s / n for s in sums]
    sums64 = [s.double() for s in sums]
    noise = max(float((s - sums64[0]).abs().max()) for s in sums64) / scale
    u = unit_roundoff(str(inputs[0].dtype).removeprefix("torch."))
    # the average's division adds one rounding of its own
    bound = ((n - 1) + (reduce_op == "avg")) * u * magnitude
    tiny = torch.finfo(inputs[0].dtype).tiny
    error = 0.0
    ratio = 0.0
    for y in outputs:
        diff = (y.double() - exact).abs()
        error = max(error, float(diff.max()) / scale)
        ratio = max(ratio, float((diff / (bound + tiny)).max()))
    return len(sums), noise, error, ratio
