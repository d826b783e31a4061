"""``grads`` checks: first-batch gradients per layer, device vs reference; where NaN starts.

The first backward is where a numerics problem shows before the optimizer
smears it: a layer whose gradient norm differs from the reference, gradients
that explode or vanish, or a NaN born in one module's backward.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from precguard.checks._lab import Gradients, lab
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding


def _layer_of(param: str) -> str:
    """``model.layers.3.mlp.down_proj.weight`` -> ``model.layers.3``; else the owning module."""
    parts = param.split(".")
    for i, part in enumerate(parts[:-1]):
        if part.isdigit():
            return ".".join(parts[: i + 1])
    return ".".join(parts[:-1]) or "root"


def _per_layer(grads: Gradients) -> dict[str, tuple[float, torch.Tensor]]:
    """Layer -> (exact gradient norm, concatenated sample of its gradient values)."""
    squares: dict[str, float] = {}
    values: dict[str, list[torch.Tensor]] = {}
    for name, g in grads.sample.items():
        layer = _layer_of(name)
        squares[layer] = squares.get(layer, 0.0) + grads.norms[name] ** 2
        values.setdefault(layer, []).append(g.flatten())
    return {k: (math.sqrt(squares[k]), torch.cat(v)) for k, v in values.items()}


def first_batch(
    ctx: CheckContext,
    explode: float = 1e3,
    vanish: float = 1e-8,
    ratio_tolerance: float = 0.1,
) -> Finding:
    """Per-layer gradient norm and direction on the device vs the reference for batch 0."""
    bench = lab(ctx)
    cid = "grads.first_batch"
    ref_layers = _per_layer(bench.gradients("reference"))
    dev_layers = _per_layer(bench.training_gradients("device"))
    rows: dict[str, dict[str, float]] = {}
    bad: list[str] = []
    min_cos = max(1 - 64 * bench.eps, 0.99)  # msprobe: cosine >= 0.99 for fp16/bf16
    for layer, (rn, r) in ref_layers.items():
        dn, d = dev_layers[layer]
        finite = math.isfinite(dn) and bool(torch.isfinite(d).all())
        cos = (
            float(torch.nn.functional.cosine_similarity(r, d, dim=0))
            if finite and r.norm() > 0 and d.norm() > 0
            else 1.0
        )
        rows[layer] = {"reference_norm": rn, "device_norm": dn, "cosine": cos}
        if not finite:
            bad.append(f"{layer}: non-finite gradient")
        elif rn > 0 and (abs(dn / rn - 1) > ratio_tolerance or cos < min_cos):
            bad.append(f"{layer}: norm {dn:.3g} vs {rn:.3g}, cosine {cos:.4f}")
    total = math.sqrt(sum(v["device_norm"] ** 2 for v in rows.values()))
    vanished = [k for k, v in rows.items() if v["reference_norm"] > 0 and v["device_norm"] < vanish]
    evidence = {
        "compute_dtype": bench.compute_dtype,
        "total_device_norm": total,
        "min_cosine_allowed": min_cos,
        "layers": rows,
    }
    remedy = (
        "Find the first layer (from the loss backwards) whose gradient departs and check its "
        "forward numerics (norm, RoPE, attention) with the other checks; keep master weights "
        "and the optimizer state in fp32, and scale the loss in fp16."
    )
    if bad or vanished:
        what = bad[0] if bad else f"{vanished[0]}: gradient vanished"
        return finding(
            cid,
            "fail",
            f"first-batch gradients differ from the reference in {len(bad) + len(vanished)} "
            f"layer(s): {what}",
            {**evidence, "differing": bad[:10], "vanished": vanished[:10]},
            remedy,
        )
    if total > explode:
        return finding(
            cid,
            "warn",
            f"the first-batch gradient norm is {total:.3g} (> {explode:g})",
            evidence,
            remedy,
        )
    return finding(
        cid,
        "pass",
        f"first-batch gradients of {len(rows)} layer(s) match the reference (norm within "
        f"{ratio_tolerance:.0%}, cosine >= {min_cos:.4f}); total norm {total:.3g}",
        evidence,
    )


def nonfinite_origin(ctx: CheckContext) -> Finding:
    """Run forward and backward on the device; name the module where NaN/Inf first appears."""
    bench = lab(ctx)
    cid = "grads.nonfinite_origin"
    if bench.target.loss is None:
        raise NotApplicable("target gives no loss")
    # the device's unscaled forward and backward, run once for every gradient check
    grads = bench.gradients("device")
    seen = bench.nonfinite_watch()
    forward_origin, backward_seen = seen.forward_origin, seen.backward_seen
    # a norm is finite exactly when every element of the gradient is
    bad_params = [n for n, norm in grads.norms.items() if not math.isfinite(norm)]
    evidence: dict[str, Any] = {
        "loss": grads.loss,
        "nonfinite_params": bad_params[:10],
        "forward_origin": forward_origin[0] if forward_origin else None,
    }
    remedy = (
        "Look at the named module: an fp16 overflow (use fp32 for its reductions or scale the "
        "loss less), a division by a zero norm (add eps), a log of zero, or saturation mode "
        "hiding the overflow until the backward; rerun `precguard record --device ... --train` "
        "with on_nonfinite='raise' to stop at it."
    )
    if forward_origin:
        return finding(
            cid,
            "fail",
            f"NaN/Inf first appears in the forward output of {forward_origin[0]}",
            evidence,
            remedy,
        )
    first_bad = next((i for i, (_, ok) in enumerate(backward_seen) if not ok), None)
    if first_bad is not None:
        module = backward_seen[first_bad][0]
        producer = backward_seen[first_bad - 1][0] if first_bad else "the loss"
        evidence["backward_order"] = [m for m, _ in backward_seen[: first_bad + 1]][-5:]
        return finding(
            cid,
            "fail",
            f"NaN/Inf is born in the backward: the gradient reaching {module}'s output is "
            f"non-finite, produced by the backward of {producer}",
            evidence,
            remedy,
        )
    if bad_params or not math.isfinite(evidence["loss"]):
        return finding(
            cid, "fail", f"non-finite gradients in {', '.join(bad_params[:3])}", evidence, remedy
        )
    return finding(
        cid,
        "pass",
        f"forward and backward on {ctx.device} stay finite ({len(backward_seen)} module "
        "gradients watched)",
        evidence,
    )


CHECKS = [
    Check(
        "grads.first_batch",
        "First-batch gradient norm and direction per layer, device vs reference.",
        first_batch,
    ),
    Check(
        "grads.nonfinite_origin",
        "The module where NaN/Inf first appears in forward or backward on the device.",
        nonfinite_origin,
    ),
]
