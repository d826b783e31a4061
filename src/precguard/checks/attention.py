"""``attention`` checks: score overflow, masked positions, SDPA backends, the KV cache.

Attention scores are the largest activations of a transformer; in fp16 they
overflow before the softmax, masks built with fp32's minimum become -inf in
fp16 and turn fully masked rows into NaN, and the fused attention kernels
accumulate differently from the math path.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from precguard import tree
from precguard._logging import get_logger
from precguard.checks._lab import Lab, lab, logits_of, rel_error
from precguard.checks._trace import SHARED_WATCHES, OpCallback, SharedWatch, watch_ops
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding
from precguard.numerics import DIFFERENCE_GROWTH, PRECISION_STEP, TOLERANCE_EPS
from precguard.oracle import run_in_fp64
from precguard.target import call_model

logger = get_logger(__name__)

_SOFTMAX = {"softmax", "_softmax"}
_MASK_FLOOR = -1e4  # scores below this are mask values, not data


def _softmax_seen(calls: list[dict[str, Any]], pad: int = 0, seq: int | None = None) -> OpCallback:
    """An op callback that appends scalars about each softmax call to ``calls``."""

    def seen(_op: str, args: tuple, _kwargs: dict, result: Any, module: str) -> None:
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is None or not isinstance(result, torch.Tensor):
            return
        xd = x.detach()
        real = torch.where(torch.isfinite(xd) & (xd > _MASK_FLOOR), xd, 0).abs()
        leaked, measured = 0.0, False
        p = result.detach()
        if seq is not None and p.dim() >= 3 and p.shape[-1] == seq and p.shape[-2] > pad:
            leaked = float(torch.nan_to_num(p[0, ..., pad:, :pad].float(), nan=0.0).max())
            measured = True
        calls.append(
            {
                "module": module,
                "input_dtype": x.dtype,
                "score_absmax": float(real.max()) if real.numel() else 0.0,
                "output_nonfinite": int((~torch.isfinite(p)).sum()),
                "leaked": leaked,
                "leak_measured": measured,
            }
        )

    return seen


#: the device's shared forward (Lab.output) and the oracle's record every softmax
SHARED_WATCHES["softmax"] = SharedWatch(
    frozenset(_SOFTMAX), _softmax_seen, frozenset({"device", "oracle"})
)


def _softmax_calls(
    bench: Lab, on: str, batch: Any = None, pad: int = 0, seq: int | None = None
) -> tuple[list[dict[str, Any]], Any]:
    """Scalars about every softmax in one forward (no probabilities are kept).

    ``on`` is ``device``, ``reference`` or ``oracle`` (the reference model under
    the fp64 oracle: the scores the code means, whatever it casts them to).
    With ``pad`` and ``seq``: the largest probability that real queries of
    sample 0 put on its first ``pad`` (padded) key positions.
    """
    calls: list[dict[str, Any]] = []
    seen = _softmax_seen(calls, pad, seq)
    if on == "oracle" and batch is None and not pad and seq is None:
        return bench.watched("softmax", "oracle") or [], None  # the shared oracle forward
    if on == "oracle":

        def watched(m: torch.nn.Module, b: Any) -> Any:
            with watch_ops(m, _SOFTMAX, seen):  # type: ignore[arg-type]
                return call_model(m, b)

        out = run_in_fp64(
            watched,
            bench.batch(0) if batch is None else batch,
            module=bench.reference_model(),
            copy_module=False,  # each op widens the fp32 weights it reads: no fp64 model copy
        )
        return calls, out
    model = bench.copy("device" if on == "device" else "reference")
    out = bench.forward(
        model,
        on,  # type: ignore[arg-type]
        batch,
        inner=watch_ops(model, _SOFTMAX, seen),  # type: ignore[arg-type]
    )
    return calls, out


def softmax_overflow(ctx: CheckContext) -> Finding:
    """Attention scores (softmax inputs) against the device dtype's range; NaN/Inf after softmax."""
    bench = lab(ctx)
    cid = "attention.softmax_overflow"
    try:
        ref_calls, _ = _softmax_calls(bench, "oracle")
        scores_from = "fp64 oracle"
    except Exception as exc:  # a model the oracle cannot run: the fp32 reference's scores
        logger.warning("softmax_oracle_failed", error=f"{type(exc).__name__}: {exc}")
        ref_calls, _ = _softmax_calls(bench, "reference")
        scores_from = f"{ctx.reference} (the fp64 oracle failed: {type(exc).__name__})"
    shared = bench.watched("softmax", "device")  # the device's plain forward, shared
    dev_calls = shared if shared is not None else _softmax_calls(bench, "device")[0]
    if not ref_calls:
        raise NotApplicable("the model calls no softmax in its forward (fused attention?)")
    limit = float(torch.finfo(bench.compute_dtype).max)
    worst = max(ref_calls, key=lambda c: c["score_absmax"])
    bad = [c for c in dev_calls if c["output_nonfinite"]]
    evidence = {
        "compute_dtype": bench.compute_dtype,
        "dtype_max": limit,
        "softmax_calls": len(ref_calls),
        "max_score": worst["score_absmax"],
        "max_score_module": worst["module"],
        "scores_from": scores_from,
        "device_nonfinite_modules": sorted({c["module"] for c in bad}),
    }
    remedy = (
        "Compute attention scores and softmax in fp32: scale q by 1/sqrt(d) before q@k^T "
        "(not after), call softmax(scores.float(), dim=-1).to(q.dtype), or use a fused "
        "attention kernel that accumulates in fp32 (on Ascend npu_fusion_attention with "
        "inner_precise=0)."
    )
    if bad:
        return finding(
            cid,
            "fail",
            f"softmax returns NaN/Inf on {ctx.device} in {bad[0]['module']}",
            evidence,
            remedy,
        )
    if worst["score_absmax"] > limit:
        return finding(
            cid,
            "fail",
            f"attention scores reach {worst['score_absmax']:.3g} in {worst['module']}, beyond "
            f"{bench.cname}'s max {limit:.3g}",
            evidence,
            remedy,
        )
    if worst["score_absmax"] > limit / 16:
        return finding(
            cid,
            "warn",
            f"attention scores reach {worst['score_absmax']:.3g} in {worst['module']}, within "
            f"16x of {bench.cname}'s max",
            evidence,
            remedy,
        )
    return finding(
        cid,
        "pass",
        f"attention scores peak at {worst['score_absmax']:.3g}, far below {bench.cname}'s "
        f"max {limit:.3g}; no NaN/Inf after softmax on {ctx.device}",
        evidence,
    )


#: names a model's forward may give its padding mask (1 = attend, 0 = padding)
MASK_ARGUMENTS = ("attention_mask", "mask", "padding_mask", "attn_mask")


def _padded_batch(bench: Lab, pad: int) -> tuple[dict[str, Any], str, int]:
    """Batch 0 as keyword arguments with sample 0 left-padded by ``pad`` tokens.

    A tensor or tuple batch is bound to the model's ``forward`` signature; the
    token ids are ``input_ids`` or the first 2-D integer tensor, and the mask goes
    to the first parameter named in :data:`MASK_ARGUMENTS`. Returns the keyword
    batch, the mask's parameter name and the sequence length.
    """
    batch = bench.batch(0)
    forward = bench.reference_model().forward
    try:
        params = inspect.signature(forward).parameters
    except (TypeError, ValueError) as exc:
        raise NotApplicable(f"cannot read the model's forward signature ({exc})") from exc
    if tree.is_mapping(batch):
        kwargs = dict(batch)
    else:
        args = batch if isinstance(batch, tuple) else (batch,)
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params.values()):
            raise NotApplicable("the model's forward takes *args: its inputs have no names")
        try:
            kwargs = dict(inspect.signature(forward).bind_partial(*args).arguments)
        except TypeError as exc:
            raise NotApplicable(f"the batch does not bind to the model's forward ({exc})") from exc
    ids_name = "input_ids" if "input_ids" in kwargs else None
    if ids_name is None:
        ids_name = next(
            (
                k
                for k, v in kwargs.items()
                if isinstance(v, torch.Tensor) and v.dim() == 2 and not v.is_floating_point()
            ),
            None,
        )
    if ids_name is None:
        raise NotApplicable("the batch holds no 2-D tensor of token ids to pad")
    mask_name = next((n for n in MASK_ARGUMENTS if n in params), None)
    if mask_name is None:
        raise NotApplicable(
            f"the model's forward takes no padding mask (none of {', '.join(MASK_ARGUMENTS)})"
        )
    ids = kwargs[ids_name].clone()
    if ids.shape[1] <= pad:
        raise NotApplicable(f"the batch is {ids.shape[1]} tokens long, too short to pad {pad}")
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0  # left padding on the first sample, as in batched generation
    return {**kwargs, ids_name: ids, mask_name: mask}, mask_name, ids.shape[1]


def masking(ctx: CheckContext, pad: int = 4) -> Finding:
    """Left-pad one sample: masked keys must get no probability and nothing may turn NaN."""
    bench = lab(ctx)
    cid = "attention.masking"
    padded, mask_name, seq = _padded_batch(bench, pad)
    calls, out = _softmax_calls(bench, "device", padded, pad=pad, seq=seq)
    logits = logits_of(out).detach().float().cpu()
    leaked = max((c["leaked"] for c in calls), default=0.0)
    measured = sum(c["leak_measured"] for c in calls)
    real_nonfinite = int((~torch.isfinite(logits[:, pad:])).sum())
    padded_nonfinite = int((~torch.isfinite(logits[0, :pad])).sum())
    evidence = {
        "padding": f"sample 0 left-padded by {pad} tokens",
        "mask_argument": mask_name,
        "max_probability_on_masked_keys": leaked,
        "softmax_calls_over_the_keys": measured,
        "nonfinite_logits_real_positions": real_nonfinite,
        "nonfinite_logits_padded_positions": padded_nonfinite,
        "softmax_calls_with_nonfinite": sorted(
            {c["module"] for c in calls if c["output_nonfinite"]}
        ),
    }
    remedy = (
        "Build the additive mask with the compute dtype's own minimum "
        "(torch.finfo(scores.dtype).min, not fp32's min cast to fp16, which is -inf) or use "
        "masked_fill on scores in fp32; zero fully masked rows after the softmax "
        "(torch.nan_to_num or where(mask.any(-1), p, 0)); pass position_ids derived from the "
        "attention mask when padding on the left."
    )
    if real_nonfinite:
        return finding(
            cid,
            "fail",
            f"with left padding, {real_nonfinite} logits of real tokens become NaN/Inf on "
            f"{ctx.device}",
            evidence,
            remedy,
        )
    if leaked > 1e-3:
        return finding(
            cid,
            "fail",
            f"masked (padding) keys still receive probability up to {leaked:.3g}",
            evidence,
            remedy,
        )
    if padded_nonfinite:
        return finding(
            cid,
            "warn",
            "fully masked rows (padding positions) turn NaN/Inf; harmless only while nothing "
            "reads those positions",
            evidence,
            remedy,
        )
    return finding(
        cid,
        "pass",
        f"left padding is masked exactly (max leaked probability {leaked:.2g} over "
        f"{measured} softmax call(s)) and no NaN/Inf appears"
        if measured
        else "no NaN/Inf appears with left padding; the probability on padded keys was not "
        "measured (no softmax over the keys is visible: fused attention?)",
        evidence,
    )


def sdpa_backend(ctx: CheckContext) -> Finding:
    """Eager attention vs torch's scaled_dot_product_attention on the device, same weights."""
    bench = lab(ctx)
    cid = "attention.sdpa_backend"
    config = getattr(bench.reference_model(), "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        raise NotApplicable("the model has no transformers config to switch the attention kernel")
    outputs = {}
    for impl in ("eager", "sdpa"):
        model = bench.copy("device")
        model.config._attn_implementation = impl
        outputs[impl] = logits_of(bench.forward(model, "device")).detach()
    err = rel_error(outputs["sdpa"], outputs["eager"])
    tol = DIFFERENCE_GROWTH * TOLERANCE_EPS * bench.eps  # two kernels within op-check's tol
    evidence = {
        "configured": getattr(config, "_attn_implementation", None),
        "rel_error_sdpa_vs_eager": err,
        "tolerance": tol,
    }
    if torch.cuda.is_available():
        evidence["cuda_sdpa_backends"] = {
            "flash": torch.backends.cuda.flash_sdp_enabled(),
            "mem_efficient": torch.backends.cuda.mem_efficient_sdp_enabled(),
            "math": torch.backends.cuda.math_sdp_enabled(),
        }
    if err > tol:
        return finding(
            cid,
            "fail" if err > PRECISION_STEP * tol else "warn",
            f"SDPA and eager attention differ by {err:.3g} (relative) on {ctx.device}, above "
            f"{tol:.2g}",
            evidence,
            "Pin the attention implementation in both runs (attn_implementation='eager' for "
            "parity, or the same SDPA backend via torch.nn.attention.sdpa_kernel); fused "
            "kernels that accumulate in fp16 need inner_precise / fp32 accumulation.",
        )
    return finding(
        cid,
        "pass",
        f"SDPA and eager attention agree within {err:.2g} (relative) on {ctx.device}",
        evidence,
    )


def kv_cache(ctx: CheckContext, new_tokens: int = 4) -> Finding:
    """Incremental decoding with the KV cache vs one full forward; the cache's dtype."""
    bench = lab(ctx)
    cid = "attention.kv_cache"
    batch = bench.batch(0)
    if not tree.is_mapping(batch) or "input_ids" not in batch:
        raise NotApplicable("the batch is not a mapping with input_ids")
    ids = batch["input_ids"]
    if ids.shape[1] <= new_tokens:
        raise NotApplicable("the batch is too short to split into prompt and new tokens")
    model = bench.copy("device")
    full = logits_of(bench.forward(model, "device", {"input_ids": ids})).detach()
    dev = bench.dev
    prompt = ids[:, :-new_tokens].to(dev)
    # transformers 5 calls the cache ``cache``; 4.x called it ``past_key_values``
    params = inspect.signature(model.forward).parameters
    cache_arg = "cache" if "cache" in params else "past_key_values"
    with torch.no_grad(), bench.device.numerics():
        try:
            out = model(input_ids=prompt, use_cache=True)
        except TypeError as exc:
            raise NotApplicable(f"the model does not take use_cache ({exc})") from exc
        past = getattr(out, cache_arg, None)
        if past is None:
            raise NotApplicable("the model returned no KV cache")
        steps = []
        for i in range(new_tokens):
            pos = ids.shape[1] - new_tokens + i
            step = model(
                input_ids=ids[:, pos : pos + 1].to(dev), **{cache_arg: past}, use_cache=True
            )
            past = getattr(step, cache_arg)
            steps.append(step.logits[:, -1].detach())
    incremental = torch.stack(steps, dim=1)
    err = rel_error(incremental, full[:, -new_tokens:])
    cache_dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in _cache_tensors(past)})
    tol = DIFFERENCE_GROWTH * TOLERANCE_EPS * bench.eps  # two kernels within op-check's tol
    evidence = {
        "new_tokens": new_tokens,
        "rel_error_incremental_vs_full": err,
        "tolerance": tol,
        "cache_dtypes": cache_dtypes,
        "model_dtype": bench.dtype,
        "compute_dtype": bench.compute_dtype,
    }
    remedy = (
        "Keep the KV cache in the model's activation dtype (not a lower one) and make the "
        "decode path use the same attention kernel and mask as the prefill; with a quantized "
        "or fp16 cache on a bf16/fp32 model, expect and budget for this error."
    )
    if err > tol:
        return finding(
            cid,
            "fail" if err > PRECISION_STEP * tol else "warn",
            f"decoding with the KV cache differs from a full forward by {err:.3g} (relative)",
            evidence,
            remedy,
        )
    lower = [
        d for d in cache_dtypes if torch.finfo(getattr(torch, d)).eps > torch.finfo(bench.dtype).eps
    ]
    if lower:
        return finding(
            cid,
            "warn",
            f"the KV cache is stored in {lower[0]}, below the model's {bench.dtype}",
            evidence,
            remedy,
        )
    return finding(
        cid,
        "pass",
        f"KV-cache decoding matches a full forward within {err:.2g}; cache dtype "
        f"{', '.join(cache_dtypes)}",
        evidence,
    )


def _cache_tensors(past: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    layers = getattr(past, "layers", None)
    if layers is not None:
        for layer in layers:
            for attr in ("keys", "values"):
                t = getattr(layer, attr, None)
                if isinstance(t, torch.Tensor):
                    found.append(t)
    for attr in ("key_cache", "value_cache"):
        for t in getattr(past, attr, []) or []:
            if isinstance(t, torch.Tensor):
                found.append(t)
    if not found and isinstance(past, tuple | list):
        for item in past:
            found.extend(
                t
                for t in (item if isinstance(item, tuple | list) else [item])
                if isinstance(t, torch.Tensor)
            )
    return found


CHECKS = [
    Check(
        "attention.softmax_overflow",
        "Attention scores vs the device dtype's range; NaN/Inf after softmax.",
        softmax_overflow,
    ),
    Check(
        "attention.masking",
        "Left padding: masked keys get zero probability and nothing turns NaN.",
        masking,
    ),
    Check(
        "attention.sdpa_backend",
        "Eager vs scaled_dot_product_attention on the device with the same weights.",
        sdpa_backend,
    ),
    Check(
        "attention.kv_cache",
        "Incremental decoding with the KV cache matches a full forward; cache dtype.",
        kv_cache,
    ),
]
