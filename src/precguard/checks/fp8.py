"""``fp8`` checks: does each fp8 GEMM's scale fit the operand it scales?

The classic fp8 failures are all a scale that does not fit: an amax that
overflows (a saturated share), values flushed to zero (an underflow share), a
delayed scale from an amax history that no longer holds after a spike, and
master weights kept in fp8 (updates below half a spacing vanish). Like
Transformer Engine's debug tools, the checks report per GEMM and name the
layer. The GEMMs' operand statistics come from the device's fp8 kernels
(the ``emu:fp8-*`` profiles collect them while they quantize, at no extra
pass over the tensor); the thresholds are derived in ``numerics.py``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from precguard import numerics
from precguard.checks._lab import Lab, call_model, lab
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding

_FP8_DTYPES = frozenset(
    getattr(torch, n) for n in numerics.FP8_FORMATS if hasattr(torch, n)
)  # fmt: skip
_ROLES = ("activation", "weight")


def _gemm_statistics(ctx: CheckContext, calls: int) -> tuple[list[dict], str]:
    """Forward ``calls`` batches in one numerics context; per-GEMM operand statistics,
    each entry with the Linear it belongs to (``module``), and the fp8 dtype."""
    bench = lab(ctx)
    cached = ctx.cache.get(f"fp8_stats{calls}")  # the three fp8 checks share one run
    if cached is not None:
        return cached
    backend = bench.device
    profile = getattr(backend, "profile", None)
    fmt = getattr(profile, "fp8_format", "none")
    if fmt == "none":
        raise NotApplicable(f"{ctx.device} runs no fp8 GEMMs (an emu:fp8-* profile does)")
    from precguard.backends.emu import fp8

    model = bench.copy("device").eval()
    sites = {
        m.weight.untyped_storage().data_ptr(): name
        for name, m in model.named_modules()
        if isinstance(m, nn.Linear)
    }
    with torch.no_grad(), backend.numerics(), fp8.collect() as log:
        for step in range(calls):
            call_model(model, bench.place(bench.batch(step), "device"))
    counts: dict[str, int] = {}
    for entry in log:
        name = sites.get(entry["site"], "unnamed GEMM")
        entry["module"] = name
        entry["call"] = counts.get(name, 0)
        counts[name] = entry["call"] + 1
    result = (log, str(fp8.FORMATS[fmt]).removeprefix("torch."))
    ctx.cache[f"fp8_stats{calls}"] = result
    return result


def _worst(log: list[dict], key: str) -> tuple[dict, int, dict] | None:
    best = None
    for entry in log:
        for i, stats in enumerate(entry["operands"]):
            if best is None or stats[key] > best[2][key]:
                best = (entry, i, stats)
    return best


def _where(entry: dict, operand: int) -> str:
    return f"{entry['module']} (call {entry['call']}, its {_ROLES[operand]})"


def saturation(ctx: CheckContext, calls: int = 2) -> Finding:
    """Per fp8 GEMM, the share of each operand beyond the format's range (saturated)."""
    cid = "fp8.saturation"
    log, dtype = _gemm_statistics(ctx, calls)
    worst = _worst(log, "saturated")
    if worst is None:
        raise NotApplicable("the forward ran no fp8 GEMM")
    entry, operand, stats = worst
    allowed = numerics.fp8_saturation_share(dtype, stats["numel"])
    evidence: dict[str, Any] = {
        "dtype": dtype,
        "gemms": len(log),
        "worst": _where(entry, operand),
        "saturated_share": stats["saturated"],
        "allowed_share": allowed,
        "amax": stats["amax"],
        "scale": stats["scale"],
    }
    if stats["saturated"] > allowed:
        return finding(
            cid,
            "fail",
            f"{_where(entry, operand)} saturates {stats['saturated']:.2%} of its elements "
            f"at the {dtype} max (more than one element: its scale does not fit it)",
            evidence,
            "Scale this operand from its own amax (current or block scaling), shorten the "
            "amax history or add margin; find what grew (a loss spike, an outlier channel).",
        )
    return finding(
        cid,
        "pass",
        f"no fp8 GEMM operand saturates more than one element ({len(log)} GEMMs, {dtype})",
        evidence,
    )


def underflow(ctx: CheckContext, calls: int = 2) -> Finding:
    """Per fp8 GEMM, the share of nonzero operand elements flushed to zero."""
    cid = "fp8.underflow"
    log, dtype = _gemm_statistics(ctx, calls)
    worst = _worst(log, "underflow")
    if worst is None:
        raise NotApplicable("the forward ran no fp8 GEMM")
    entry, operand, stats = worst
    allowed = numerics.fp8_underflow_share(dtype)
    evidence = {
        "dtype": dtype,
        "gemms": len(log),
        "worst": _where(entry, operand),
        "underflow_share": stats["underflow"],
        "allowed_share": allowed,
        "amax": stats["amax"],
        "scale": stats["scale"],
    }
    if stats["underflow"] > allowed:
        return finding(
            cid,
            "fail",
            f"{_where(entry, operand)} flushes {stats['underflow']:.2%} of its nonzero "
            f"elements to zero in {dtype} (an outlier sets its scale far above the bulk)",
            evidence,
            "Use finer scales (1 x 128 / 128 x 128 blocks) so one outlier does not set the "
            "scale of the whole tensor, or keep this GEMM in bf16.",
        )
    return finding(
        cid,
        "pass",
        f"every fp8 GEMM operand keeps its nonzero elements (worst flushed share "
        f"{stats['underflow']:.2g}, allowed {allowed:.2g})",
        evidence,
    )


def stale_scale(ctx: CheckContext, calls: int = 2) -> Finding:
    """A scale standing for an amax below the operand's own (delayed scaling's history)."""
    cid = "fp8.stale_scale"
    log, dtype = _gemm_statistics(ctx, calls)
    if not log:
        raise NotApplicable("the forward ran no fp8 GEMM")
    # a scale made from this operand stands for its amax exactly (or above it: a power of
    # two); below it by more than one rounding of the format, it was made from another
    tolerance = 1.0 - numerics.unit_roundoff(dtype)
    stale = [
        (e, i, s)
        for e in log
        for i, s in enumerate(e["operands"])
        if s["scale_amax_ratio"] < tolerance
    ]
    evidence: dict[str, Any] = {"dtype": dtype, "gemms": len(log), "stale": len(stale)}
    if not stale:
        return finding(
            cid, "pass", f"every fp8 scale covers its operand's amax ({len(log)} GEMMs)", evidence
        )
    entry, operand, stats = min(stale, key=lambda x: x[2]["scale_amax_ratio"])
    evidence |= {
        "worst": _where(entry, operand),
        "amax": stats["amax"],
        "scale_amax": stats["scale_amax_ratio"] * stats["amax"],
        "growth": 1.0 / stats["scale_amax_ratio"],
        "saturated_share": stats["saturated"],
    }
    return finding(
        cid,
        "fail",
        f"{_where(entry, operand)} is scaled for an amax {1 / stats['scale_amax_ratio']:.3g}x "
        f"below its own: a stale scale (delayed scaling's amax history predates its growth)",
        evidence,
        "After a spike, reset or shorten the amax history, or use current scaling for this "
        "GEMM; a scale must come from an amax that covers the tensor it scales.",
    )


def master_weights(ctx: CheckContext) -> Finding:
    """Parameters stored in fp8: an optimizer's small updates round away."""
    cid = "fp8.master_weights"
    bench: Lab = lab(ctx)
    # the model as the target builds it: the checks' copies are cast to a float dtype
    built = bench.run.prepared(bench.build_fresh(bench.reference))
    held = [(n, p) for n, p in built.named_parameters() if p.dtype in _FP8_DTYPES]
    evidence: dict[str, Any] = {"fp8_parameters": sorted({n for n, _ in held})[:10]}
    if held:
        name, p = held[0]
        dtype = str(p.dtype).removeprefix("torch.")
        return finding(
            cid,
            "fail",
            f"{len({n for n, _ in held})} parameter(s) are stored in fp8 ({name}: {dtype}): an "
            f"update below half a spacing ({numerics.unit_roundoff(dtype):.3g} relative) is lost",
            evidence,
            "Keep master weights in fp32 (or bf16 with fp32 optimizer state) and cast to fp8 "
            "per GEMM, as Transformer Engine does.",
        )
    return finding(cid, "pass", "no parameter is stored in fp8", evidence)


CHECKS = [
    Check(
        "fp8.saturation",
        "Per fp8 GEMM: the share of each operand saturated at the format's max.",
        saturation,
    ),
    Check(
        "fp8.underflow",
        "Per fp8 GEMM: the share of nonzero operand elements flushed to zero.",
        underflow,
    ),
    Check(
        "fp8.stale_scale",
        "Per fp8 GEMM: a scale made from an amax below the operand's own (stale history).",
        stale_scale,
    ),
    Check("fp8.master_weights", "Parameters stored in fp8 (master weights).", master_weights),
]
