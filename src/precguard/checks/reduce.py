"""``reduce`` checks: how much of the device-vs-reference difference is reduction-order noise.

Two correct backends add the terms of a matmul or a sum in different orders
and so disagree in the last bits; that noise grows through the layers. A
difference within a few times that spread is order noise; one far above it
is a real numeric difference worth localising. A device that stores fp16 or
bf16 rounds reordering away and differs from an fp32 reference by its own
precision: there a difference within a few eps of that dtype is no bug either.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from precguard.capture.hooks import OpsHandle, on_ops
from precguard.checks._lab import lab, logits_of, rel_error
from precguard.checks.base import Check, CheckContext, Finding, finding


class ShuffledReduction:
    """Permute the contraction dimension of linear/matmul: same math, another order.

    Run an op through it (``on_ops(run=ShuffledReduction(seed))``, or
    :func:`shuffled_reduction`) and a linear or a matmul adds its terms in a
    seeded random order; every other op runs as called.
    """

    def __init__(self, seed: int) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def _perm(self, n: int, device: torch.device) -> torch.Tensor:
        return torch.randperm(n, generator=self.gen).to(device)

    def __call__(self, func: Any, args: tuple, kwargs: dict) -> Any:
        if func is F.linear and len(args) >= 2:
            x, w = args[0], args[1]
            p = self._perm(x.shape[-1], x.device)
            return func(x.index_select(-1, p), w.index_select(-1, p), *args[2:], **kwargs)
        if (
            func in (torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm)
            and len(args) == 2
        ):
            a, b = args
            if a.dim() >= 2 and b.dim() >= 2:
                p = self._perm(a.shape[-1], a.device)
                return func(a.index_select(-1, p), b.index_select(-2, p), **kwargs)
        return func(*args, **kwargs)


def shuffled_reduction(seed: int) -> OpsHandle:
    """A context in which linear and matmul reduce in a seeded random order (enter it once)."""
    return on_ops(run=ShuffledReduction(seed))


def order_sensitivity(ctx: CheckContext, runs: int = 3, factor: float = 4.0) -> Finding:
    """Spread of the device's output under shuffled reduction order vs the device-reference gap.

    Runs only the shuffled forwards that can change the verdict: none when the
    gap is zero or, on a device below fp32, within ``factor`` eps of its compute
    dtype (a pass whatever the spread); otherwise up to ``runs``, stopping as
    soon as the largest spread reaches ``gap / factor`` (a pass that more runs,
    which can only raise the maximum, would not undo).
    """
    bench = lab(ctx)
    cid = "reduce.order_sensitivity"
    base = logits_of(bench.output("device")).detach()  # the plain run every check shares
    gap = rel_error(base, bench.reference_logits())
    evidence: dict[str, Any] = {
        "device_vs_reference_rel": gap,
        "factor": factor,
        "compute_dtype": bench.compute_dtype,
    }
    if gap == 0:
        return finding(cid, "pass", f"{ctx.device} reproduces the reference bit for bit", evidence)
    if bench.eps > torch.finfo(torch.float32).eps and gap <= factor * bench.eps:
        # below fp32, rounding to the storage dtype hides reordering; the gap to an fp32
        # reference is that rounding, and is judged against the dtype's own precision
        evidence["compute_dtype_tolerance"] = factor * bench.eps
        return finding(
            cid,
            "pass",
            f"the device-vs-reference difference ({gap:.2g}) is within {factor:g}·eps of "
            f"{bench.cname}, the precision {ctx.device} computes in (no shuffled run needed)",
            evidence,
        )
    model = bench.copy("device")
    spreads: list[float] = []
    for seed in range(runs):
        shuffled = logits_of(
            bench.forward(model, "device", inner=shuffled_reduction(seed))
        ).detach()
        spreads.append(rel_error(shuffled, base))
        if max(spreads) > 0 and gap / max(spreads) <= factor:
            break  # within factor x the noise already: more runs only raise the noise
    spread = max(spreads)
    evidence.update({"order_noise_rel": spread, "per_run": spreads})
    ratio = gap / spread if spread > 0 else float("inf")
    evidence["gap_over_noise"] = ratio
    if ratio <= factor:
        return finding(
            cid,
            "pass",
            f"the device-vs-reference difference ({gap:.2g}) is within {factor:g}x the "
            f"reduction-order noise ({spread:.2g}): order noise, not a bug",
            evidence,
        )
    against = (
        f"is {ratio:.3g}x the reduction-order noise ({spread:.2g})"
        if spread > 0
        else "is there although reordering the reductions changes nothing on the device"
    )
    return finding(
        cid,
        "warn",
        f"the device-vs-reference difference ({gap:.2g}) {against}: a real numeric "
        "difference, not reordering",
        evidence,
        "Localise it: record both devices and run `precguard compare` (or this checklist with "
        "--golden) for the first divergent layer; the norm, rope, attention and ops findings "
        "above name the usual suspects. If the device runs at a lower precision than the "
        "reference by design, this gap is the price of that precision.",
    )


CHECKS = [
    Check(
        "reduce.order_sensitivity",
        "Output spread under shuffled reduction order vs the device-reference difference.",
        order_sensitivity,
    ),
]
