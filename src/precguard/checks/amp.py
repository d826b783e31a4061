"""``amp`` checks: loss scaling, gradient clipping and ops forced to low precision.

In fp16 small gradients underflow to zero unless the loss is scaled up before
backward; a dynamic scaler that overflows keeps skipping steps; clipping that
triggers on one device and not on the other changes every update; and an op
that autocast (or the model's own code) forces to fp16 loses what its fp32
inputs carried.

A target declares its loss scaling with the checklist parameter
``loss_scale`` (a number, ``dynamic`` or ``none``) or an attribute on the
Target: ``target.grad_scaler = lambda: torch.amp.GradScaler(...)``.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from precguard.checks._lab import Lab, declared_loss_scale, lab
from precguard.checks._trace import watch_ops
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding
from precguard.devices import dtype_name
from precguard.numerics import AMPLIFICATION

#: ops that lose accuracy when run below fp32 (what autocast keeps in fp32 on CUDA)
SENSITIVE_OPS = {
    "softmax", "log_softmax", "layer_norm", "group_norm", "rms_norm", "exp", "log", "pow",
    "rsqrt", "sum", "mean", "cumsum", "norm", "cross_entropy", "nll_loss", "var", "std",
    "logsumexp", "cos", "sin",
}  # fmt: skip


def _declared_scale(bench: Lab, loss_scale: float | str | None) -> tuple[str, float | None]:
    """("none"|"static"|"dynamic", initial scale) from the parameter or the target."""
    if loss_scale is None:
        scale = declared_loss_scale(bench.target)
        return ("none", None) if scale is None else ("dynamic", scale)
    if isinstance(loss_scale, str):
        if loss_scale == "none":
            return "none", None
        if loss_scale == "dynamic":
            return "dynamic", 2.0**16
        loss_scale = float(loss_scale)
    return "static", float(loss_scale)


def _underflow(dev: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> tuple[float, str]:
    lost = total = 0
    worst, worst_share = "", 0.0
    for name, r in ref.items():
        live = r != 0
        n = int(live.sum())
        if not n:
            continue
        k = int((live & (dev[name] == 0)).sum())
        lost, total = lost + k, total + n
        if k / n > worst_share:
            worst, worst_share = name, k / n
    return (lost / total if total else 0.0), worst


def loss_scaling(
    ctx: CheckContext,
    loss_scale: float | str | None = None,
    threshold: float = 0.01,
    max_skips: int = 8,
) -> Finding:
    """Share of gradient elements that underflow to zero, with and without the loss scale."""
    bench = lab(ctx)
    cid = "amp.loss_scaling"
    if bench.compute_dtype == torch.float32:
        raise NotApplicable(f"{ctx.device} computes in float32 (no reduced-precision training)")
    mode, scale = _declared_scale(bench, loss_scale)
    ref = bench.gradients("reference")
    plain = bench.gradients("device")
    share_plain, worst_plain = _underflow(plain.sample, ref.sample)
    evidence: dict[str, Any] = {
        "compute_dtype": bench.compute_dtype,
        "declared_loss_scaling": mode,
        "underflow_share_unscaled": share_plain,
        "most_affected_param_unscaled": worst_plain,
        "threshold": threshold,
    }
    if not plain.finite:
        return finding(
            cid,
            "warn",
            f"gradients are NaN/Inf on {ctx.device} before any loss scaling, so scaling cannot "
            "be judged; the cause is upstream (see grads.nonfinite_origin)",
            evidence,
            "Fix the non-finite backward first; then rerun this check.",
        )
    if bench.compute_dtype == torch.bfloat16 and share_plain <= threshold:
        # decided without a scaled backward: bf16 needs no loss scale
        return finding(
            cid,
            "pass",
            f"bf16 keeps fp32's exponent range: {share_plain:.2%} of gradient elements "
            "underflow without scaling",
            evidence,
        )
    scaled, probe, skipped = bench.scaled_gradients(
        scale if scale is not None else 2.0**16, max_skips
    )
    share_scaled, _ = _underflow(scaled.sample, ref.sample)
    evidence.update(
        {
            "scale_tried": probe,
            "overflow_skips_before_finite": skipped,
            "underflow_share_scaled": share_scaled,
        }
    )
    # the scale this run found to give finite gradients, not a textbook 2**16: under fp16
    # (emulated or real) 2**16 can overflow the first backward of the very model checked
    remedy = (
        f"Scale the loss in fp16 training: scaler = torch.amp.GradScaler(init_scale={probe:g}) "
        "(torch_npu.npu.amp.GradScaler on Ascend, torch.mlu.amp.GradScaler on Cambricon); "
        "scaler.scale(loss).backward(); scaler.unscale_(optimizer) before clipping; "
        "scaler.step(optimizer); scaler.update(). Or train in bf16, which has fp32's range."
    )
    if mode == "none" and share_plain > threshold:
        return finding(
            cid,
            "fail",
            f"no loss scaling in {bench.cname}: {share_plain:.1%} of nonzero gradient "
            f"elements underflow to zero (worst {worst_plain}); scaling by {probe:g} leaves "
            f"{share_scaled:.2%}",
            evidence,
            remedy,
        )
    if mode != "none" and share_scaled > threshold:
        return finding(
            cid,
            "fail",
            f"the loss scale {probe:g} is too small: {share_scaled:.1%} of gradient elements "
            "still underflow",
            evidence,
            remedy,
        )
    if skipped and mode == "static":
        return finding(
            cid,
            "fail",
            f"the static loss scale {scale:g} overflows the gradients (inf); it needs to be "
            f"{probe:g} or lower",
            evidence,
            "Use a dynamic scaler (torch.amp.GradScaler), which lowers the scale after an "
            "overflow, or a smaller static scale.",
        )
    if skipped > 2:
        return finding(
            cid,
            "warn",
            f"a dynamic scaler would skip {skipped} step(s) for overflow before a finite step",
            evidence,
            "Start the scaler lower (init_scale) so fewer first steps are skipped.",
        )
    if mode == "none":
        warn = share_plain > threshold / AMPLIFICATION  # an order of magnitude below
        return finding(
            cid,
            "warn" if warn else "pass",
            f"no loss scaling declared; {share_plain:.2%} of gradient elements underflow now "
            "(more as the loss falls)",
            evidence,
            remedy if warn else "",
        )
    return finding(
        cid,
        "pass",
        f"loss scaling ({mode}, {probe:g}) keeps gradient underflow at {share_scaled:.2%}",
        evidence,
    )


def grad_clipping(ctx: CheckContext, max_norm: float = 1.0) -> Finding:
    """Gradient norm vs the clipping threshold on device and reference."""
    bench = lab(ctx)
    cid = "amp.grad_clipping"
    ref_norm = bench.gradients("reference").total_norm
    dev_norm = bench.training_gradients("device").total_norm
    evidence = {
        "max_norm": max_norm,
        "reference_grad_norm": ref_norm,
        "device_grad_norm": dev_norm,
        "clips_on_reference": ref_norm > max_norm,
        "clips_on_device": dev_norm > max_norm,
    }
    remedy = (
        "Clip after unscaling (scaler.unscale_(optimizer); "
        f"torch.nn.utils.clip_grad_norm_(params, {max_norm})), compute the norm in fp32, and "
        "set max_norm from the reference's measured gradient norms."
    )
    if not math.isfinite(dev_norm):
        return finding(
            cid,
            "warn",
            f"the gradient norm on {ctx.device} is {dev_norm}: clipping would turn every "
            "gradient into NaN (the cause is upstream, see grads.nonfinite_origin)",
            evidence,
            remedy,
        )
    if (ref_norm > max_norm) != (dev_norm > max_norm):
        return finding(
            cid,
            "fail",
            f"clipping at {max_norm:g} triggers on one side only (reference norm {ref_norm:.4g}, "
            f"device norm {dev_norm:.4g})",
            evidence,
            remedy,
        )
    ratio = dev_norm / ref_norm if ref_norm else math.inf
    evidence["norm_ratio"] = ratio
    if not 0.9 <= ratio <= 1.1:
        return finding(
            cid,
            "warn",
            f"the device's gradient norm is {ratio:.3g}x the reference's",
            evidence,
            remedy,
        )
    return finding(
        cid,
        "pass",
        f"gradient norms agree ({dev_norm:.4g} vs {ref_norm:.4g}); clipping at {max_norm:g} "
        f"{'triggers' if dev_norm > max_norm else 'does not trigger'} on both",
        evidence,
    )


def autocast_ops(ctx: CheckContext, dtype: str | None = None) -> Finding:
    """Ops that produce a lower dtype than their inputs under autocast or the model's own casts."""
    bench = lab(ctx)
    cid = "amp.autocast_ops"
    low = getattr(torch, dtype) if dtype else bench.compute_dtype
    if low == torch.float32:
        raise NotApplicable(f"{ctx.device} computes in float32 and no autocast dtype was given")
    lowered: dict[str, set[str]] = {}

    def seen(op: str, args: tuple, _kw: dict, result: Any, module: str) -> None:
        ins = [a for a in args if isinstance(a, torch.Tensor) and a.is_floating_point()]
        if not ins or not isinstance(result, torch.Tensor) or not result.is_floating_point():
            return
        widest = max((a.dtype for a in ins), key=lambda d: torch.finfo(d).bits)
        if torch.finfo(result.dtype).bits < torch.finfo(widest).bits:
            lowered.setdefault(op, set()).add(module)

    device_type = bench.dev.type
    try:
        torch.autocast(device_type=device_type, dtype=low)
    except RuntimeError as exc:
        raise NotApplicable(
            f"torch.autocast does not support {dtype_name(low)} on {device_type}: {exc}"
        ) from exc
    from precguard.checks._graphs import ops_below_reference

    # one forward under autocast serves both: the op watch rides on the traced graph's run
    below = ops_below_reference(
        bench,
        SENSITIVE_OPS,
        lambda: torch.autocast(device_type=device_type, dtype=low),
        watch=lambda model: watch_ops(model, None, seen),
    )
    sensitive = {op: sorted(mods) for op, mods in lowered.items() if op in SENSITIVE_OPS}
    evidence = {
        "autocast_dtype": low,
        "ops_lowered": {op: sorted(m)[:5] for op, m in lowered.items()},
        "precision_sensitive_lowered": sensitive,
        # per module and op, against the reference run (op capture, see checks/_graphs.py)
        "ops_below_reference": below[:20],
    }
    if sensitive:
        op = sorted(sensitive)[0]
        return finding(
            cid,
            "warn",
            f"under autocast to {dtype_name(low)}, precision-sensitive op(s) "
            f"{', '.join(sorted(sensitive))} run in {dtype_name(low)} "
            f"(e.g. {op} in {sensitive[op][0]})",
            evidence,
            "Keep reductions, norms, softmax and exp/log in fp32 under autocast: call them on "
            "x.float() (autocast leaves explicit fp32 inputs of these ops alone) or wrap the "
            "region in torch.autocast(device_type, enabled=False); on Ascend set "
            "ACL_PRECISION_MODE=must_keep_origin_dtype.",
        )
    return finding(
        cid,
        "pass",
        f"under autocast to {dtype_name(low)}, only matmul-like ops run in {dtype_name(low)} "
        f"({', '.join(sorted(lowered)) or 'none'}); norms, softmax and reductions keep fp32",
        evidence,
    )


CHECKS = [
    Check(
        "amp.loss_scaling",
        "Gradient underflow with and without the loss scale; overflow skips.",
        loss_scaling,
    ),
    Check(
        "amp.grad_clipping",
        "Gradient norm vs the clipping threshold, device vs reference.",
        grad_clipping,
    ),
    Check(
        "amp.autocast_ops",
        "Ops that run below their inputs' dtype under autocast (ops forced to fp16).",
        autocast_ops,
    ),
]
