"""``fp8`` checks: does each fp8 GEMM's scale fit the operand it scales?

The classic fp8 failures are all a scale that does not fit: an amax that
overflows (a saturated share), values flushed to zero (an underflow share), a
delayed scale from an amax history that no longer holds after a spike, and
master weights kept in fp8 (updates below half a spacing vanish). Like
Transformer Engine's debug tools, the checks report per GEMM and name the
layer. The GEMMs' operand statistics come from the device's fp8 kernels
(the ``emu:fp8-*`` profiles collect them while they quantize, at no extra
pass over the tensor) and, on any device, from the real float8 tensors the
model's modules receive or hold (inputs, parameters, buffers), measured by
capture's ``fp8_statistics`` as ``monitor`` records them; the thresholds are
derived in ``numerics.py``.
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
    """Per fp8 GEMM (an emulator's) and per real float8 tensor, operand statistics,
    each entry with the module it belongs to (``module``), and the fp8 dtype."""
    cached = ctx.cache.get(f"fp8_stats{calls}")  # the three fp8 checks share one run
    if cached is not None:
        return cached
    emulated = _emulated_gemms(ctx, calls)
    real = _float8_tensors(ctx, calls)
    if emulated is None and not real:
        raise NotApplicable(
            f"{ctx.device} runs no fp8 GEMMs (an emu:fp8-* profile does) and the model's "
            "modules receive and hold no float8 tensor"
        )
    log, dtype = emulated if emulated is not None else ([], real[0]["dtype"])
    result = (log + real, dtype)
    ctx.cache[f"fp8_stats{calls}"] = result
    return result


def _float8_tensors(ctx: CheckContext, calls: int) -> list[dict]:
    """The float8 tensors each module receives (inputs) or holds (its own parameters and
    buffers) in ``calls`` forwards of the model as the target builds it (the checks'
    copies are cast to a float dtype), one entry per module call with their Stats.fp8."""
    from precguard.capture import hooks
    from precguard.capture.stats import StatsBuffer
    from precguard.tree import map_tensors

    bench: Lab = lab(ctx)
    # a probe of the user's model: without one float8 tensor in it, nothing to read
    model = bench.run.prepared(bench.build_fresh(bench.reference)).to(device=bench.dev).eval()
    counts: dict[str, int] = {}
    log: list[dict] = []

    def observe(name: str, module: nn.Module, args: Any, kwargs: Any) -> None:
        found: list[tuple[str, torch.Tensor]] = []
        map_tensors((args, kwargs), lambda t: found.append(("input", t)) or t)
        held = [*module.named_parameters(recurse=False), *module.named_buffers(recurse=False)]
        found += [(f"{n} ({'parameter' if isinstance(t, nn.Parameter) else 'buffer'})", t)
                  for n, t in held]  # fmt: skip
        found = [(role, t) for role, t in found if t.dtype in _FP8_DTYPES]
        if not found:
            return
        buffer = StatsBuffer()
        for _role, t in found:
            buffer.add(t.detach())
        stats = buffer.materialize()
        operands = []
        for (_role, t), row in zip(found, stats, strict=True):
            # the share at the value below the max: what a clean tensor's ±max share
            # is judged against (numerics.fp8_stored_saturation_share)
            below = numerics.fp8_below_max(t.dtype)
            below_share = float((t.detach().float().abs() == below).sum()) / max(t.numel(), 1)
            allowed = numerics.fp8_stored_saturation_share(t.numel(), below_share)
            operands.append(
                {**row["fp8"], "numel": t.numel(), "scale_amax_ratio": 1.0,
                 "below_max_share": below_share, "allowed_saturated": allowed}
            )  # fmt: skip
        call = counts.get(name, 0)
        counts[name] = call + 1
        dtype = str(found[0][1].dtype).removeprefix("torch.")
        log.append({"module": name, "call": call, "operands": operands, "dtype": dtype,
                    "roles": [role for role, _ in found], "real": True})  # fmt: skip

    with (
        hooks.on_calls(model, pre=observe, root_name="model", errors="raise"),
        torch.no_grad(),
        bench.device.numerics(),
    ):
        for step in range(calls):
            call_model(model, bench.run.move(bench.batch(step)))
    return log


def _emulated_gemms(ctx: CheckContext, calls: int) -> tuple[list[dict], str] | None:
    """The emulator's per-GEMM operand statistics (None: the device runs no fp8 GEMM)."""
    bench = lab(ctx)
    backend = bench.device
    profile = getattr(backend, "profile", None)
    fmt = getattr(profile, "fp8_format", "none")
    if fmt == "none":
        return None
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
    return log, str(fp8.FORMATS[fmt]).removeprefix("torch.")


def _worst(log: list[dict], key: str) -> tuple[dict, int, dict] | None:
    best = None
    for entry in log:
        for i, stats in enumerate(entry["operands"]):
            if best is None or _excess(stats, key) > _excess(best[2], key):
                best = (entry, i, stats)
    return best


def _excess(stats: dict, key: str) -> float:
    # a stored float8 tensor's ±max share is judged against its own allowance
    # (numerics.fp8_stored_saturation_share): rank by what exceeds it
    if key == "saturated" and "allowed_saturated" in stats:
        return stats[key] - stats["allowed_saturated"]
    return stats[key]


def _where(entry: dict, operand: int) -> str:
    role = entry["roles"][operand] if "roles" in entry else _ROLES[operand]
    return f"{entry['module']} (call {entry['call']}, its {role})"


def _allowance(stats: dict) -> str:
    if "allowed_saturated" in stats:
        return (
            f"the {stats['allowed_saturated']:.2%} allowed: the {stats['below_max_share']:.2%} "
            "at the value below the max and its count's noise"
        )
    return "one element"


def saturation(ctx: CheckContext, calls: int = 2) -> Finding:
    """Per fp8 GEMM, the share of each operand beyond the format's range (saturated)."""
    cid = "fp8.saturation"
    log, dtype = _gemm_statistics(ctx, calls)
    worst = _worst(log, "saturated")
    if worst is None:
        raise NotApplicable("the forward ran no fp8 GEMM")
    entry, operand, stats = worst
    dtype = entry.get("dtype", dtype)
    allowed = stats.get("allowed_saturated", numerics.fp8_saturation_share(dtype, stats["numel"]))
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
            f"at the {dtype} max (more than {_allowance(stats)}: its scale does not fit it)",
            evidence,
            "Scale this operand from its own amax (current or block scaling), shorten the "
            "amax history or add margin; find what grew (a loss spike, an outlier channel).",
        )
    return finding(
        cid,
        "pass",
        f"no fp8 GEMM operand or float8 tensor saturates ({len(log)} GEMMs and module "
        f"calls, {dtype})",
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
    dtype = entry.get("dtype", dtype)
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
    # two); below it by more than one rounding of the format, it was made from another.
    # A real float8 tensor no longer holds the amax it was quantized from (what its scale
    # clipped is gone): its entries carry ratio 1 and only fp8.saturation judges them
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
    """Trainable parameters stored in fp8: an optimizer's small updates round away.

    A frozen float8 parameter (inference weights stored in fp8 with a scale) is what
    fp8 serving does and passes: only what an optimizer updates is a master weight."""
    cid = "fp8.master_weights"
    bench: Lab = lab(ctx)
    # the model as the target builds it: the checks' copies are cast to a float dtype
    built = bench.run.prepared(bench.build_fresh(bench.reference))
    held = [
        (n, p) for n, p in built.named_parameters() if p.dtype in _FP8_DTYPES and p.requires_grad
    ]
    evidence: dict[str, Any] = {"fp8_parameters": sorted({n for n, _ in held})[:10]}
    if held:
        name, p = held[0]
        dtype = str(p.dtype).removeprefix("torch.")
        return finding(
            cid,
            "fail",
            f"{len({n for n, _ in held})} trainable parameter(s) are stored in fp8 "
            f"({name}: {dtype}): an update below half a spacing "
            f"({numerics.unit_roundoff(dtype):.3g} relative) is lost",
            evidence,
            "Keep master weights in fp32 (or bf16 with fp32 optimizer state) and cast to fp8 "
            "per GEMM, as Transformer Engine does.",
        )
    return finding(cid, "pass", "no trainable parameter is stored in fp8", evidence)


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
