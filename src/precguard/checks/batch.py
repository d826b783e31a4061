"""``batch`` checks: does a prompt's output depend on what else shares its batch?

An inference server batches requests as they come. When a kernel picks its
reduction order from the batch size (a split-K GEMM for small batches, an
attention kernel tiled by the padded length), the same prompt gets different
logits under another load, and a temperature-0 answer changes. The check
decodes a prompt alone and inside batches of several sizes, left-padded
beside other prompts of other lengths, and compares the prompt's numbers
module by module: the first decoding step and the first module whose output
for the prompt depends on the batch, and whether that difference is bitwise
(last bits: another reduction order) or beyond rounding.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precguard import numerics
from precguard.capture.hooks import on_calls
from precguard.checks._lab import Lab, flatten, lab, logits_of
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding

#: the pad token id used for left padding (masked out, its value never read)
PAD_ID = 0


@dataclass
class Decoded:
    """One prompt's numbers from one decoding run: per forward call, per module, in order."""

    #: (call, module name, the prompt's slice of the module's output), in hook order
    outputs: list[tuple[int, str, torch.Tensor]] = field(default_factory=list)
    #: the prompt's last-position logits at each decoding step
    logits: list[torch.Tensor] = field(default_factory=list)
    #: the greedy tokens generated
    tokens: list[int] = field(default_factory=list)


def _prompts(ids: torch.Tensor, sizes: list[int]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The prompt under test and enough other prompts of other lengths to fill a batch."""
    rows, length = ids.shape
    n = max(2, length // 2)
    prompt = ids[0, :n]
    others = []
    for j in range(max(sizes) - 1):
        # lengths around the prompt's, shorter and longer: the padding differs per row
        other_len = max(2, min(length, n + (j % 3 - 1) * max(1, n // 3) + j))
        source = ids[(j + 1) % rows]
        others.append(source.roll(j + 1)[:other_len])
    return prompt, others


def _cache_arg(model: nn.Module) -> str:
    params = inspect.signature(model.forward).parameters
    if "attention_mask" not in params or "position_ids" not in params:
        raise NotApplicable("the model takes no attention_mask and position_ids (padding)")
    return "cache" if "cache" in params else "past_key_values"


def decode(
    bench: Lab, model: nn.Module, batch: list[torch.Tensor], row: int, new_tokens: int
) -> Decoded:
    """Greedy-decode ``batch`` (left-padded) and keep row ``row``'s numbers."""
    cache_arg = _cache_arg(model)
    width = max(len(p) for p in batch)
    ids = torch.full((len(batch), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    for i, p in enumerate(batch):
        ids[i, width - len(p) :] = p
        mask[i, width - len(p) :] = 1
    mine = len(batch[row])
    out = Decoded()
    state = {"call": 0, "seq": width, "keep": mine}

    def record(name: str, _m: nn.Module, _args: Any, _kwargs: Any, output: Any) -> None:
        for _, t in flatten(output):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point():
                continue
            if t.dim() < 2 or t.shape[0] != len(batch):
                continue
            part = t[row]
            if part.shape[0] == state["seq"]:  # positions: the prompt's own (not padding)
                part = part[state["seq"] - state["keep"] :]
            out.outputs.append((state["call"], name, part.detach().float().cpu().clone()))
            return

    # every module, containers included (a container's output is compared too);
    # a failing record stops the decode rather than leaving a silent gap
    handle = on_calls(model, post=record, modules=lambda _n, _m: True, errors="raise")
    dev = bench.dev
    try:
        with torch.no_grad(), bench.device.numerics():
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            result = model(
                input_ids=ids.to(dev),
                attention_mask=mask.to(dev),
                position_ids=positions.to(dev),
                use_cache=True,
            )
            past = getattr(result, cache_arg, None)
            for step in range(new_tokens):
                logits = logits_of(result)[:, -1].float().cpu()
                out.logits.append(logits[row].clone())
                nxt = logits.argmax(-1)
                out.tokens.append(int(nxt[row]))
                if step == new_tokens - 1 or past is None:
                    break
                state["call"] += 1
                state["seq"], state["keep"] = 1, 1
                mask = torch.cat([mask, torch.ones((len(batch), 1), dtype=torch.long)], -1)
                positions = positions[:, -1:] + 1
                result = model(
                    input_ids=nxt[:, None].to(dev),
                    attention_mask=mask.to(dev),
                    position_ids=positions.to(dev),
                    use_cache=True,
                    **{cache_arg: past},
                )
                past = getattr(result, cache_arg, None)
    finally:
        handle.remove()
    return out


@dataclass
class Dependence:
    """Where one batch configuration first changed the prompt's numbers."""

    config: str
    step: int | None  # first decoding step whose logits differ (None: identical)
    token_step: int | None  # first step whose greedy token differs
    module: str | None  # first module (in call order) whose output differs
    call: int | None
    kind: str  # "bitwise" | "within rounding" | "beyond rounding" | "identical"
    error: float
    allowed: float


def _compare(
    alone: Decoded, batched: Decoded, config: str, dtype: str, modules: dict[str, nn.Module]
) -> Dependence:
    # the same model code on both: the same steps and the same module calls, in order
    pairs = zip(alone.logits, batched.logits, strict=True)
    step = next((i for i, (a, b) in enumerate(pairs) if not torch.equal(a, b)), None)
    tokens = zip(alone.tokens, batched.tokens, strict=True)
    token_step = next((i for i, (a, b) in enumerate(tokens) if a != b), None)
    for (call, name, a), (_, _, b) in zip(alone.outputs, batched.outputs, strict=True):
        if a.shape != b.shape or torch.equal(a, b):
            continue
        m = numerics.measure(b, a)
        k = getattr(modules.get(name), "in_features", None) or a.shape[-1]
        # two correct reduction orders differ by at most both their floors
        allowed = numerics.REORDER_DIFFERENCE * numerics.rounding_floor(dtype, k)
        kind = "within rounding" if m.rel_l2 <= allowed else "beyond rounding"
        return Dependence(config, step, token_step, name, call, kind, m.rel_l2, allowed)
    kind = "identical" if step is None else "bitwise"
    return Dependence(config, step, token_step, None, None, kind, 0.0, 0.0)


def invariance(
    ctx: CheckContext, sizes: list[int] | None = None, new_tokens: int = 3, bitwise: bool = True
) -> Finding:
    """Decode a prompt alone and in left-padded batches of ``sizes``; name what differs.

    ``bitwise`` (default): any difference fails (a served answer must not depend on
    the load); False: a difference within rounding only warns.
    """
    cid = "batch.invariance"
    bench = lab(ctx)
    sizes = sorted({int(s) for s in (sizes or [2, 4, 8]) if int(s) >= 2})
    if not sizes:
        raise NotApplicable("no batch size of 2 or more to compare")
    batch = bench.batch(0)
    ids = batch.get("input_ids") if isinstance(batch, dict) else None
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[1] < 4:
        raise NotApplicable("the batch has no input_ids of at least 4 positions")
    prompt, others = _prompts(ids, sizes)
    model = bench.copy("device").eval()
    modules = dict(model.named_modules())
    alone = decode(bench, model, [prompt], 0, new_tokens)
    dtype = str(bench.device.compute_dtype() or bench.dtype).removeprefix("torch.")
    results = []
    for size in sizes:
        row = size // 2  # not the first row: a kernel may treat row 0 apart
        members = [*others[:row], prompt, *others[row : size - 1]]
        decoded = decode(bench, model, members, row, new_tokens)
        lengths = [len(p) for p in members]
        config = f"batch {size}, row {row}, lengths {lengths}"
        results.append(_compare(alone, decoded, config, dtype, modules))
    evidence: dict[str, Any] = {
        "prompt_length": len(prompt),
        "new_tokens": new_tokens,
        "compute_dtype": dtype,
        "configs": [
            {
                "config": r.config,
                "kind": r.kind,
                "first_step": r.step,
                "first_token_changed": r.token_step,
                "first_module": r.module,
                "forward_call": r.call,
                "rel_error": r.error,
                "rounding_allows": r.allowed,
            }
            for r in results
        ],
    }
    differing = [r for r in results if r.kind != "identical"]
    if not differing:
        return finding(
            cid,
            "pass",
            f"the prompt decodes bitwise identically alone and in batches of "
            f"{', '.join(map(str, sizes))} (left-padded, beside prompts of other lengths)",
            evidence,
        )
    first = differing[0]
    worst = max(differing, key=lambda r: math.inf if r.kind == "beyond rounding" else r.error)
    where = (
        f"{first.module} (forward call {first.call}: "
        f"{'prefill' if first.call == 0 else f'decode step {first.call}'})"
        if first.module
        else "no module output (only the logits)"
    )
    step = f"step {first.step}" if first.step is not None else "no logits (modules only)"
    tokens = (
        f"; the greedy token changes at step {first.token_step}"
        if first.token_step is not None
        else "; the greedy tokens stay the same"
    )
    summary = (
        f"the prompt's numbers depend on its batch ({first.config}): first at {where}, "
        f"{first.kind} (error {first.error:.3g}, another reduction order allows "
        f"{first.allowed:.3g}); first differing logits at {step}{tokens}"
    )
    status = "fail"
    if not bitwise and worst.kind != "beyond rounding" and first.token_step is None:
        status = "warn"
    return finding(
        cid,
        status,
        summary,
        evidence,
        f"Make {first.module or 'the first differing kernel'} batch-invariant: a fixed "
        "reduction order whatever the batch size (no split-K or tile size chosen from the "
        "number of rows, an attention kernel whose KV split does not depend on the padded "
        "length; e.g. the batch-invariant kernels of vLLM/SGLang, "
        "torch.use_deterministic_algorithms does not suffice).",
    )


CHECKS = [
    Check(
        "batch.invariance",
        "Decode a prompt alone and in padded batches of several sizes; name the first layer "
        "and token whose output depends on the batch.",
        invariance,
    ),
]
