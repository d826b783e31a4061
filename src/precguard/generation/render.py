"""The terminal summary of a :class:`GenerationDiff` (rich markup)."""

from __future__ import annotations

import math

from rich.console import Console
from rich.markup import escape

from precguard.generation.report import GenerationDiff, PromptResult


def _token(text: str | None, token: int) -> str:
    return f"{token} {text!r}" if text is not None else str(token)


def _prompt_line(r: PromptResult) -> str:
    fd = r.first_divergence
    head = f"prompt {r.index} ({r.prompt_tokens} tokens, {r.seconds:.2f} s)"
    if fd is None:
        return f"  {head}: [green]same tokens[/] for {len(r.golden_tokens)} steps"
    color = "yellow" if fd.kind == "near-tie" else "red"
    margins = (
        f"margins golden {fd.golden_margin:.3g} / actual {fd.actual_margin:.3g}"
        if fd.golden_margin is not None and fd.actual_margin is not None
        else "actual logits non-finite"
    )
    return (
        f"  {head}: [{color}]{fd.kind}[/] at step {fd.step}: golden "
        f"{escape(_token(fd.golden_text, fd.golden_token))}, actual "
        f"{escape(_token(fd.actual_text, fd.actual_token))} ({margins}, tolerance "
        f"{fd.tolerance:.3g}); {r.flips} flip(s) in {len(r.golden_tokens)} steps"
    )


def render_terminal(result: GenerationDiff, console: Console) -> None:
    """Print the verdict, one line per prompt, the layerwise first divergence and the cause."""
    g, a = result.golden, result.actual
    console.print(
        f"generate-diff: golden {escape(g.device)} ({g.compute_dtype}) vs actual "
        f"{escape(a.device)} ({a.compute_dtype}), {result.mode}, {result.summary.steps} new tokens"
    )
    for r in result.prompts:
        console.print(_prompt_line(r))
        kv = r.kv_cache
        if kv is not None and kv.verdict == "cache":
            console.print(f"    [red]kv-cache[/]: {escape(kv.reason)}")
        elif r.first_divergence is not None and r.first_divergence.kind == "divergence":
            console.print(f"    {escape(r.first_divergence.reason)}")
    s = result.summary
    median = f"{s.median_first_step:g}" if s.median_first_step is not None else "-"
    console.print(
        f"summary: {s.diverged}/{s.prompts} diverged, {s.near_ties} near-tie(s), median first "
        f"step {median}, mean KL {_kl(result)}, {s.kv_cache_faults} KV-cache fault(s), "
        f"{s.seconds_per_prompt:.2f} s per prompt"
    )
    lw = result.layerwise
    if lw is not None:
        fd = lw.first_divergence
        where = escape(str(fd.get("module") or fd.get("key"))) if fd else "none"
        console.print(
            f"layerwise (prompt {lw.prompt}, step {lw.step}, position {lw.position}): "
            f"{lw.verdict}; first divergence: [bold]{where}[/]"
        )
        fault = _cache_fault(result, lw.prompt)
        if fd and fault is not None:
            # the replay reads each side's own cache: a faulty one makes the reading layer
            # (or the root, whose inputs hold the cache) diverge, and compare's reason would
            # blame that layer's code or "different data"; the cache is the cause
            console.print(
                f"  the actual's KV cache is faulty ({escape(fault)}): the replayed forward "
                "reads that cache, so this first divergence is no evidence of a fault of this "
                "layer's own; the cause is the cache"
            )
        elif fd and fd.get("reason"):
            console.print(f"  {escape(str(fd['reason']))}")
    elif result.layerwise_note:
        console.print(f"layerwise: {escape(result.layerwise_note)}")
    if result.cause is not None:
        where = escape(result.cause.where or "-")
        console.print(f"cause: [bold]{result.cause.kind}[/] {where}")
    word = {
        "match": "[green]MATCH[/]",
        "near-ties": "[yellow]NEAR-TIES ONLY[/]",
        "inconclusive": "[yellow]INCONCLUSIVE[/] (no step decoded: nothing was compared)",
    }
    console.print(f"verdict: {word.get(result.verdict, '[red]DIVERGED[/]')}")


def _kl(result: GenerationDiff) -> str:
    """The mean KL, said to be non-finite when a step's logits were (never a small number)."""
    s = result.summary
    if s.mean_kl is None:
        return "-"
    if not math.isfinite(s.mean_kl):
        steps = sum(1 for r in result.prompts for k in r.kl if k is None or not math.isfinite(k))
        return f"non-finite ({steps} step(s) with NaN/Inf logits)"
    return f"{s.mean_kl:.3g} nats"


def _cache_fault(result: GenerationDiff, prompt: int) -> str | None:
    """The KV-cache fault's reason on ``prompt``, or None when its cache is sound."""
    kvs = (r.kv_cache for r in result.prompts if r.index == prompt)
    return next((kv.reason for kv in kvs if kv is not None and kv.verdict == "cache"), None)
