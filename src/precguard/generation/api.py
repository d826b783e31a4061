"""``generate_diff``: decode the same prompts on two sides and find where and why they part.

The golden decodes freely (greedy, or seeded sampling through shared Gumbel noise); the
actual is fed the golden's tokens. The first flip is judged (:mod:`.judge`), the first
real divergence replayed layer by layer (:mod:`.layerwise`), the caches compared
(:mod:`.kvcache`).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precguard.compare.impact_report import RemedyCheck
from precguard.errors import PrecguardError, UsageError
from precguard.generation.decode import (
    DecodeSide,
    Decoding,
    decode,
    gumbel_noise,
    hidden_size,
    layer_count,
)
from precguard.generation.judge import judge_flip, kl_divergence, rel_l2, top_k_overlap
from precguard.generation.kvcache import kv_cache_result
from precguard.generation.prompts import Prompt, build_prompts, make_tokenizer, token_texts
from precguard.generation.report import (
    Cause,
    GenerationDiff,
    Layerwise,
    PromptResult,
    SideReport,
    StepPoint,
    Summary,
    TokenDivergence,
)
from precguard.numerics import less_precise, stacked_floor
from precguard.target import Target, load_target
from precguard.target_run import Side, one_side, refuse_beside

#: (device, prompt index, step, steps per prompt) after each decoded step of either side
ProgressFn = Callable[[str, int, int, int], None]


@dataclass
class Decoded:
    """One side's decodings of every prompt, with what is needed to judge them."""

    side: SideReport
    hidden: int | None
    layers: int
    decodings: list[Decoding] = field(default_factory=list)
    fed: list[list[int]] = field(default_factory=list)
    seconds: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class DecodingOptions:
    """How both sides decode."""

    steps: int
    sample: bool = False
    seed: int = 0
    temperature: float = 1.0
    top_k: int = 5

    def noise(self, prompt: int, vocab: int) -> torch.Tensor | None:
        """The shared Gumbel noise of prompt ``prompt`` (None when greedy)."""
        return gumbel_noise(self.seed, prompt, self.steps, vocab) if self.sample else None


def decode_side(
    side: DecodeSide,
    prompts: Sequence[Prompt],
    opts: DecodingOptions,
    *,
    forced: Sequence[list[int]] | None = None,
    on_progress: ProgressFn | None = None,
) -> Decoded:
    """Decode every prompt on ``side`` (fed ``forced[i]`` when given)."""
    info = SideReport(
        device=side.device,
        dtype=side.dtype,
        compute_dtype=side.compute_dtype,
        target=side.target.name,
    )
    out = Decoded(info, None, layer_count(side.model))
    vocab = None
    for i, prompt in enumerate(prompts):

        def tick(step: int, i: int = i) -> None:
            if on_progress is not None:
                on_progress(side.device, i, step, opts.steps)

        if opts.sample and vocab is None:  # the vocabulary is known after the first prefill
            vocab = decode(side, prompt.ids, 1, cache_free=False).scores.shape[-1]
        noise = None if vocab is None else opts.noise(i, vocab)
        fed = None if forced is None else forced[i]
        start = time.perf_counter()
        d = decode(
            side,
            prompt.ids,
            opts.steps,
            forced=fed,
            noise=noise,
            temperature=opts.temperature,
            on_step=tick,
        )
        out.seconds.append(time.perf_counter() - start)
        vocab = d.scores.shape[-1]
        out.decodings.append(d)
        out.fed.append(list(fed if fed is not None else d.chosen)[: opts.steps])
    assert vocab is not None
    out.hidden = hidden_size(side.model, vocab)
    return out


def judge_prompt(
    index: int,
    prompt: Prompt,
    golden: Decoded,
    actual: Decoded,
    opts: DecodingOptions,
    tokenizer: Any = None,
) -> PromptResult:
    """Compare the two sides' decodings of one prompt."""
    g, a = golden.decodings[index], actual.decodings[index]
    bad = (~torch.isfinite(g.scores)).any(dim=-1).nonzero()
    if bad.numel():
        raise UsageError(
            f"the reference ({golden.side.device}) computed non-finite logits for prompt "
            f"{index} at step {int(bad[0])}: it cannot serve as the golden"
        )
    # the error a correct model explains in the less precise of the two compute dtypes
    dtype = less_precise(golden.side.compute_dtype, actual.side.compute_dtype)
    explained = stacked_floor(dtype, golden.hidden, golden.layers)
    noise = opts.noise(index, g.scores.shape[-1])
    # steps stay comparable while both sides were fed the same tokens
    fed_g, fed_a = golden.fed[index], actual.fed[index]
    comparable = next(
        (t + 1 for t, (x, y) in enumerate(zip(fed_g, fed_a, strict=False)) if x != y), opts.steps
    )
    comparable = min(comparable, len(g.chosen), len(a.chosen))
    steps = [
        StepPoint(
            step=t,
            golden_token=g.chosen[t],
            actual_token=a.chosen[t],
            kl=kl_divergence(g.scores[t], a.scores[t], opts.temperature),
            top_k_overlap=top_k_overlap(g.scores[t], a.scores[t], opts.top_k),
            logits_error=rel_l2(a.scores[t], g.scores[t]),
        )
        for t in range(comparable)
    ]
    flips = [s.step for s in steps if s.golden_token != s.actual_token]
    first = None
    if flips:  # the first flip is judged; later ones are counted
        t = flips[0]
        pair = [g.chosen[t], a.chosen[t]]
        judged = judge_flip(
            g.scores[t],
            a.scores[t],
            *pair,
            explained=explained,
            temperature=opts.temperature,
            golden_noise=None if noise is None else noise[t],
        )
        texts = token_texts(tokenizer, pair) or [None, None]
        first = TokenDivergence(
            step=t,
            golden_token=pair[0],
            actual_token=pair[1],
            golden_text=texts[0],
            actual_text=texts[1],
            **judged,  # type: ignore[arg-type]
        )
    return PromptResult(
        index=index,
        text=prompt.text,
        prompt_tokens=int(prompt.ids.shape[1]),
        golden_tokens=g.chosen[:comparable],
        actual_tokens=a.chosen[:comparable],
        golden_texts=token_texts(tokenizer, g.chosen[:comparable]),
        actual_texts=token_texts(tokenizer, a.chosen[:comparable]),
        first_divergence=first,
        flips=len(flips),
        kl=[s.kl for s in steps],
        steps=steps,
        kv_cache=kv_cache_result(g, a, explained),
        seconds=golden.seconds[index] + actual.seconds[index],
    )


def summarize(results: list[PromptResult], steps: int) -> Summary:
    """The summary over prompts."""
    firsts = [r.first_divergence for r in results if r.first_divergence is not None]
    diverged = sum(1 for f in firsts if f.kind == "divergence")
    kls = [k for r in results for k in r.kl if k is not None]
    n = len(results)
    return Summary(
        prompts=n,
        steps=steps,
        diverged=diverged,
        near_ties=len(firsts) - diverged,
        share_diverged=diverged / n if n else 0.0,
        share_flipped=len(firsts) / n if n else 0.0,
        median_first_step=statistics.median(f.step for f in firsts) if firsts else None,
        mean_kl=statistics.fmean(kls) if kls else None,
        max_kl=max(kls) if kls else None,
        kv_cache_faults=sum(1 for r in results if r.kv_cache and r.kv_cache.verdict == "cache"),
        seconds_per_prompt=statistics.fmean(r.seconds for r in results) if results else 0.0,
    )


def first_divergent(results: Iterable[PromptResult]) -> PromptResult | None:
    """The first prompt whose first flip is a real divergence (not a near-tie), or None."""
    return next(
        (r for r in results if r.first_divergence and r.first_divergence.kind == "divergence"),
        None,
    )


def find_cause(results: list[PromptResult], layerwise: Layerwise | None) -> Cause | None:
    """The most likely cause of the first real divergence (cache evidence first: a cache
    fault makes the layer that reads the cache diverge, not the cache's own layer)."""
    first = first_divergent(results)
    if first is None:
        return None
    kv = first.kv_cache
    if kv is not None and kv.verdict == "cache":
        return Cause(kind="kv-cache", where=kv.where, reason=kv.reason)
    fd = layerwise.first_divergence if layerwise is not None else None
    if fd:
        module = fd.get("module") or fd.get("key")
        return Cause(kind="layer", where=module, reason=str(fd.get("reason", "")))
    return Cause(
        kind="unknown",
        where=None,
        reason="the layerwise replay found no divergent layer"
        if layerwise is not None
        else "no layerwise replay was run",
    )


def generate_diff(
    target: str | Target | None = None,
    *,
    golden: Side | None = None,
    actual: Side | None = None,
    device: str | None = None,
    reference: str | None = None,
    dtype: str | None = None,
    reference_dtype: str | None = None,
    reference_target: str | Target | None = None,
    prompts: Sequence[str | list[int]] | None = None,
    max_new_tokens: int = 16,
    sample: bool = False,
    seed: int = 0,
    temperature: float = 1.0,
    top_k: int = 5,
    layerwise: bool = True,
    keep_recordings: str | os.PathLike[str] | None = None,
    prepare: Callable[[nn.Module], Any] | None = None,
    prepare_reference: Callable[[nn.Module], Any] | None = None,
    on_progress: ProgressFn | None = None,
    verify: bool = False,
) -> GenerationDiff:
    """Decode ``prompts`` on ``reference`` (golden) and ``device`` (actual) and compare.

    The two sides are :class:`~precguard.Side` s, the one way to say them:
    ``generate_diff(golden=Side("tiny-llama"), actual=Side("tiny-llama", "emu:bf16"))``
    (``golden`` defaults to the actual's target on the CPU). The older keywords build
    them: ``target``, ``device`` (required then), ``dtype`` and ``prepare`` the actual;
    ``reference`` (None: ``"cpu"``), ``reference_dtype``, ``reference_target`` and
    ``prepare_reference`` the golden. A keyword beside the Side it belongs to is a
    usage error.

    :param target: the model (built-in name, ``file.py:fn`` or a Target); an HF causal LM
        or a module whose ``forward(input_ids, cache)`` returns ``(logits, cache)``.
    :param prompts: texts (through the target's tokenizer) or token-id lists; default: the
        target's ``texts``, else the rows of its ``batch(0)``.
    :param sample: sample with seeded Gumbel noise shared by both sides instead of greedy.
    :param layerwise: replay the first real divergence under ``monitor`` and compare it.
    :param keep_recordings: keep the replay's two recordings in this directory.
    :param prepare: alter the actual's built model (tests plant faults with it);
        ``prepare_reference`` the golden's.
    :param reference_target: another target for the golden side (default: ``target``).
    :param verify: apply the cause's remedy and measure again (:func:`verify_cause`), into
        ``GenerationDiff.remedies``.
    :returns: a :class:`GenerationDiff`; its ``exit_code`` is 1 for a real divergence.

    >>> result = precguard.generate_diff("tiny-llama", device="emu:bf16")   # doctest: +SKIP
    >>> result.summary.diverged, result.layerwise.first_divergence["module"]  # doctest: +SKIP
    """
    if max_new_tokens < 1:
        raise UsageError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
    if temperature <= 0:
        raise UsageError(f"--temperature must be positive, got {temperature}")
    if top_k < 1:
        raise UsageError(f"--top-k must be at least 1, got {top_k}")
    if actual is not None and target is not None:
        raise UsageError("generate_diff: target given beside actual=; set it on the Side")
    actual = one_side(
        actual if actual is not None else target,
        "generate_diff",
        device=device,
        dtype=dtype,
        prepare=prepare,
        default_device=None,
    )
    spec = actual.target
    actual = actual.replace(target=load_target(spec))  # loaded once for both sides
    if golden is not None and golden.target == spec:
        golden = golden.replace(target=actual.target)  # the same file target, not run twice
    if golden is None:
        golden = Side(
            load_target(reference_target) if reference_target is not None else actual.target,
            reference if reference is not None else "cpu",
            reference_dtype,
            prepare_reference,
        )
    else:
        refuse_beside(
            "generate_diff",
            "golden=",
            "the Side",
            reference=reference,
            reference_dtype=reference_dtype,
            reference_target=reference_target,
            prepare_reference=prepare_reference,
        )
    opts = DecodingOptions(max_new_tokens, sample, seed, temperature, top_k)
    golden_side = DecodeSide.open(golden)
    actual_side = DecodeSide.open(actual)
    prompt_list = build_prompts(actual_side.target, None if prompts is None else list(prompts))
    tokenizer = make_tokenizer(actual_side.target)
    golden_run = decode_side(golden_side, prompt_list, opts, on_progress=on_progress)
    actual_run = decode_side(
        actual_side, prompt_list, opts, forced=golden_run.fed, on_progress=on_progress
    )
    results = [
        judge_prompt(i, p, golden_run, actual_run, opts, tokenizer)
        for i, p in enumerate(prompt_list)
    ]
    first = first_divergent(results)
    replay = None
    if layerwise and first is not None:
        assert first.first_divergence is not None
        from precguard.generation.layerwise import replay_layerwise

        replay = replay_layerwise(
            golden_side,
            actual_side,
            prompt_list[first.index].ids,
            first.golden_tokens,
            index=first.index,
            step=first.first_divergence.step,
            keep=keep_recordings,
        )
    result = assemble(golden_run.side, actual_run.side, opts, results, replay)
    if verify and first is not None:
        decoded = (golden_side, actual_side, prompt_list[first.index].ids)
        checks = verify_cause(result, (golden, actual), decoded, golden_run.fed[first.index])
        result = result.model_copy(update={"remedies": checks})
    return result


def verify_cause(
    result: GenerationDiff,
    sides: tuple[Side, Side],
    decoded: tuple[DecodeSide, DecodeSide, torch.Tensor],
    fed: list[int],
) -> list[RemedyCheck]:
    """``--verify``: the remedy of ``result``'s cause applied and measured again, or one
    ``not run`` check saying why in one line (never nothing).

    A KV-cache cause: the first divergent prompt (``decoded``: both sides and the prompt;
    ``fed``: the golden's tokens) decoded again with the actual's cache kept in the
    model's dtype. A layer cause: the module's remedies (:func:`precguard.compare.candidates`,
    in their order) applied to the actual's model (``sides``: golden, actual) and the
    output error measured on the target's own batch, as ``compare --target --verify`` does.
    """
    from precguard.localize.impact import ActualSide, error_budget, not_run

    cause = result.cause
    if cause is not None and cause.kind == "kv-cache":
        from precguard.generation.cache_remedy import verify_cache_remedy

        return [verify_cache_remedy(*decoded, fed, where=cause.where)]
    if cause is None or cause.kind != "layer":
        why = "no cause was named" if cause is None else f"the cause is {cause.kind}"
        if result.layerwise is None:
            why = "the layerwise replay was not run (--no-layerwise), so no layer is named"
        return [not_run("none", "--verify", why)]
    from precguard.compare.advice import ordered
    from precguard.localize.verify import verify_remedies

    module, (golden, actual) = cause.where, sides
    summary = f"the remedies of {module or 'the named layer'}"
    if not module:
        return [not_run("none", summary, "the layerwise replay named no module")]
    try:
        side = ActualSide.open(actual, golden=golden.replace(target=actual.target))
        if not side.has_module(module):
            return [not_run("none", summary, f"{module} is not a module of the target's model")]
        budget = verify_remedies(side, error_budget(side, [(module, "generate-diff")]))
    except PrecguardError as exc:
        why = f"the target's model could not be re-run on its batch: {exc}"
        return [not_run("none", summary, why)]
    checks = [c for impact in budget.impacts for c in impact.remedies]
    return ordered(checks) or [
        not_run("none", summary, f"no mechanical remedy applies to {module}")
    ]


def assemble(
    golden: SideReport,
    actual: SideReport,
    opts: DecodingOptions,
    results: list[PromptResult],
    replay: Layerwise | None,
    note: str | None = None,
) -> GenerationDiff:
    """The whole report from its parts; no prompts is unusable, never a match."""
    if not results:
        raise UsageError("no prompts were decoded: nothing was compared")
    summary = summarize(results, opts.steps)
    verdict = "diverged" if summary.diverged else ("near-ties" if summary.near_ties else "match")
    if summary.steps == 0:  # saved runs of 0 steps: no token was compared, so no match
        verdict = "inconclusive"
    if note is None and summary.diverged and replay is None:
        note = "the layerwise replay was not run (--no-layerwise)"
    return GenerationDiff(
        golden=golden,
        actual=actual,
        mode="sample" if opts.sample else "greedy",
        seed=opts.seed if opts.sample else None,
        temperature=opts.temperature,
        top_k=opts.top_k,
        verdict=verdict,
        prompts=results,
        summary=summary,
        layerwise=replay,
        layerwise_note=note,
        cause=find_cause(results, replay),
    )
