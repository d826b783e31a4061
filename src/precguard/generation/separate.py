"""Two sides decoded separately (a reference on another machine), then compared.

1. ``generate_run(target, device=REF, out=GOLDEN)`` on the reference machine;
2. ``generate_run(target, device=DEV, out=ACTUAL, against=GOLDEN)`` on the machine
   under test: the same prompts and options, fed the golden's tokens; its replay of
   the first real divergence is recorded under ``monitor`` into ``ACTUAL/layerwise``;
3. ``compare_generation_runs(GOLDEN, ACTUAL)``, anywhere; with ``target`` and
   ``reference`` (on the reference machine) the golden replay is recorded too and
   compared with the actual's, giving ``layerwise``.
"""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from precguard.errors import OutputExistsError, UsageError
from precguard.generation.api import (
    Decoded,
    DecodingOptions,
    ProgressFn,
    assemble,
    decode_side,
    first_divergent,
    judge_prompt,
)
from precguard.generation.decode import DecodeSide
from precguard.generation.layerwise import record_replay, replay_ids, replay_layerwise
from precguard.generation.prompts import Prompt, build_prompts, make_tokenizer
from precguard.generation.report import GenerationDiff
from precguard.generation.saved import SavedPrompt, SavedRun, load_run, save_run
from precguard.target import Target, load_target
from precguard.target_run import Side, one_side

#: where a saved run keeps its replay recording of the first real divergence
REPLAY_DIR = "layerwise"


def _decoded(meta: SavedRun, decodings: list[Any], path: Path) -> Decoded:
    side = meta.side.model_copy(update={"saved": str(path)})
    fed, seconds = [p.fed for p in meta.prompts], [p.seconds for p in meta.prompts]
    return Decoded(side, meta.hidden, meta.layers, decodings, fed, seconds)


def _prompts(meta: SavedRun) -> list[Prompt]:
    return [Prompt(torch.tensor([p.ids], dtype=torch.long), p.text) for p in meta.prompts]


def _options(meta: SavedRun, top_k: int = 5) -> DecodingOptions:
    return DecodingOptions(meta.steps, meta.sample, meta.seed, meta.temperature, top_k)


def generate_run(
    target: str | Target | Side,
    *,
    device: str | None = None,
    out: str | os.PathLike[str],
    dtype: str | None = None,
    prompts: Sequence[str | list[int]] | None = None,
    max_new_tokens: int = 16,
    sample: bool = False,
    seed: int = 0,
    temperature: float = 1.0,
    against: str | os.PathLike[str] | None = None,
    prepare: Callable[[nn.Module], Any] | None = None,
    on_progress: ProgressFn | None = None,
) -> Path:
    """Decode on one side and save it to ``out`` (see the module docstring).

    With ``against`` (a saved golden run) the prompts and decoding options are the
    golden's, every step is fed the golden's tokens, and the first real divergence
    is replayed under ``monitor`` into ``out/layerwise``. ``target`` is a
    :class:`~precguard.Side` (the one way), or a target spec with ``device`` (then
    required), ``dtype`` and ``prepare`` as keywords.
    """
    one = one_side(
        target, "generate_run", device=device, dtype=dtype, prepare=prepare, default_device=None
    )
    out_path = Path(out)
    if out_path.exists() and (not out_path.is_dir() or any(out_path.iterdir())):
        raise OutputExistsError(f"--save-run {out_path}: exists and is not empty")
    target_obj = load_target(one.target)
    golden = None
    if against is not None:
        g_meta, g_dec = load_run(against)
        golden = _decoded(g_meta, g_dec, Path(against))
        prompt_list = _prompts(g_meta)
        opts = _options(g_meta)
        forced: list[list[int]] | None = golden.fed
    else:
        if max_new_tokens < 1:
            raise UsageError(f"--max-new-tokens must be at least 1, got {max_new_tokens}")
        if not -(2**63) <= seed < 2**63:  # the saved run holds it as a 64-bit integer
            raise UsageError(f"--seed must fit a signed 64-bit integer, got {seed}")
        if sample and not 0 < temperature < math.inf:
            raise UsageError(f"--temperature must be positive and finite, got {temperature}")
        prompt_list = build_prompts(target_obj, None if prompts is None else list(prompts))
        opts = DecodingOptions(max_new_tokens, sample, seed, temperature)
        forced = None
    side = DecodeSide.open(one.replace(target=target_obj))
    decoded = decode_side(side, prompt_list, opts, forced=forced, on_progress=on_progress)
    meta = SavedRun(
        side=decoded.side,
        hidden=decoded.hidden,
        layers=decoded.layers,
        steps=opts.steps,
        sample=opts.sample,
        seed=opts.seed,
        temperature=opts.temperature,
        against=str(against) if against is not None else None,
        prompts=[
            SavedPrompt(
                text=p.text,
                ids=p.ids[0].tolist(),
                chosen=d.chosen,
                fed=fed,
                seconds=s,
                snapshots=list(d.caches),
                cache_free=d.free_scores is not None,
            )
            for p, d, fed, s in zip(
                prompt_list, decoded.decodings, decoded.fed, decoded.seconds, strict=True
            )
        ],
    )
    save_run(out_path, meta, decoded.decodings)
    if golden is not None:  # judged lazily: up to the first real divergence only
        judged = (judge_prompt(i, p, golden, decoded, opts) for i, p in enumerate(prompt_list))
        first = first_divergent(judged)
        if first is not None and first.first_divergence is not None:
            step = first.first_divergence.step
            ids, prefix = replay_ids(prompt_list[first.index].ids, first.golden_tokens, step)
            where = out_path / REPLAY_DIR / f"prompt-{first.index}-step-{step}"
            record_replay(side, ids, where, prefix=prefix)
    return out_path


def compare_generation_runs(
    golden: str | os.PathLike[str],
    actual: str | os.PathLike[str],
    *,
    top_k: int = 5,
    target: str | Target | None = None,
    reference: str | None = None,
    reference_dtype: str | None = None,
) -> GenerationDiff:
    """Compare two saved runs. With ``target`` and ``reference`` the golden side's replay of
    the first real divergence is recorded here and compared with the actual's own."""
    g_meta, g_dec = load_run(golden)
    a_meta, a_dec = load_run(actual)
    if [p.ids for p in g_meta.prompts] != [p.ids for p in a_meta.prompts]:
        raise UsageError(f"{golden} and {actual} decoded different prompts")
    options = operator.attrgetter("sample", "seed", "temperature")
    if options(g_meta) != options(a_meta):
        raise UsageError(f"{golden} and {actual} decoded with different options (sampling, seed)")
    g = _decoded(g_meta, g_dec, Path(golden))
    a = _decoded(a_meta, a_dec, Path(actual))
    opts = _options(g_meta, top_k)
    prompt_list = _prompts(g_meta)
    tokenizer = make_tokenizer(load_target(target)) if target is not None else None
    results = [judge_prompt(i, p, g, a, opts, tokenizer) for i, p in enumerate(prompt_list)]
    first = first_divergent(results)
    replay = None
    note = None
    if first is not None and first.first_divergence is not None:
        step = first.first_divergence.step
        recorded = Path(actual) / REPLAY_DIR / f"prompt-{first.index}-step-{step}"
        if not recorded.is_dir():
            note = (
                f"{actual} holds no replay of prompt {first.index} step {step}: make it with "
                f"--save-run ACTUAL --against {golden}"
            )
        elif target is None or reference is None:
            note = (
                f"{actual} holds the actual's replay; add --target and --reference (on the "
                "reference machine) to record the golden's and compare them layer by layer"
            )
        else:
            side = DecodeSide.build(load_target(target), reference, reference_dtype)
            prompt = prompt_list[first.index].ids
            # the golden's replay recorded here, compared with the actual's recorded one
            replay = replay_layerwise(
                side, recorded, prompt, first.golden_tokens, index=first.index, step=step
            )
    if a_meta.against is None and any(r.flips for r in results):
        extra = (
            f"{actual} was not decoded --against {golden}: steps after each prompt's first "
            "flip are not compared"
        )
        note = f"{note}; {extra}" if note else extra
    return assemble(g.side, a.side, opts, results, replay, note)
