"""``data`` checks: both runs must see the same batches, in the same order, padded the same way.

A different batch order or a shuffled sampler seeded from the clock makes
two runs disagree from the first step, and no amount of numerics work will
make them match.
"""

from __future__ import annotations

import inspect
import math
from collections import Counter
from typing import Any

import torch

from precguard import tree
from precguard.checks import fingerprints
from precguard.checks._lab import lab
from precguard.checks.base import Check, CheckContext, Finding, finding
from precguard.checks.fingerprints import padding_hash, sample_hashes, value_hash
from precguard.devices import seed_everything

_WHAT = {
    "order": "the same samples arrive in a different order",
    "padding": "the padding (attention mask) differs",
    "content": "the batch contents differ",
}
_GOLDEN_REMEDY = (
    "Feed both runs the same data: same dataset revision, tokenizer, order and padding; "
    "record the golden and the run under test from the same target and seed."
)


def _classify(
    batches: list[Any], hashes: list[str], samples: list[list[str]], padding: list[str]
) -> tuple[str, list[int]]:
    """How ``batches`` differ from the batches fingerprinted as ``hashes``/``samples``/``padding``.

    Returns ("identical" | "order" | "padding" | "content", the differing batch indices),
    over the batches both sides have. The fingerprints are those of a second
    seeded pass or the ones stored next to the golden: one rule for both.
    """
    n = min(len(hashes), len(batches))
    differing = [i for i in range(n) if hashes[i] != value_hash(batches[i])]
    if not differing:
        return "identical", []
    ours = Counter(h for b in batches[:n] for h in sample_hashes(b))
    theirs = Counter(h for hs in samples[:n] for h in hs)
    if ours and ours == theirs:
        return "order", differing
    if any(i < len(padding) and padding[i] != padding_hash(batches[i]) for i in differing):
        return "padding", differing
    return "content", differing


def _pass_of(ctx: CheckContext, batches: int) -> list[Any]:
    bench = lab(ctx)
    seed_everything(bench.reference, bench.target.seed)
    return [bench.target.batch(step) for step in range(batches)]


def batches(ctx: CheckContext, batches: int = 4) -> Finding:
    """Hash the first N batches in two seeded passes; with a golden, compare its root inputs."""
    bench = lab(ctx)
    cid = "data.batches"
    first = _pass_of(ctx, batches)
    second = _pass_of(ctx, batches)
    second_hashes = [value_hash(b) for b in second]
    kind, differing = _classify(
        first,
        second_hashes,
        [sample_hashes(b) for b in second],
        [padding_hash(b) for b in second],
    )
    evidence: dict[str, Any] = {
        "batches": batches,
        "hashes_first_pass": [value_hash(b) for b in first],
        "hashes_second_pass": second_hashes,
    }
    if kind != "identical":
        evidence["differing_batches"] = differing
        evidence["difference"] = kind
        what = _WHAT[kind]
        return finding(
            cid,
            "fail",
            f"two passes with seed {bench.target.seed} give different batches {differing}: {what}",
            evidence,
            "Make the data pipeline a function of the seed: shuffle with a seeded "
            "torch.Generator (DataLoader(generator=torch.Generator().manual_seed(seed)), "
            "seed worker processes with worker_init_fn), never random.Random() or the clock; "
            "pad to a fixed length on one side (tokenizer.padding_side) in both runs.",
        )
    golden_note = ""
    stored = fingerprints.read(ctx.golden)
    if stored is not None:
        golden_kind, golden_diff = _classify(first, stored.batches, stored.samples, stored.padding)
        evidence["golden_fingerprints_compared"] = min(len(stored.batches), len(first))
        if golden_kind != "identical":
            evidence["golden_differing_batches"] = golden_diff
            evidence["golden_difference"] = golden_kind
            return finding(
                cid,
                "fail",
                f"batches {golden_diff} differ from the golden's fingerprints "
                f"({fingerprints.FILE_NAME}): {_WHAT[golden_kind]}",
                evidence,
                _GOLDEN_REMEDY,
            )
        golden_note = f"; they equal the golden's fingerprints for {len(stored.batches)} batch(es)"
    elif ctx.golden is not None:
        mismatch, compared, pairing = _against_golden(ctx, first)
        evidence["golden_steps_compared"] = compared
        evidence.update(pairing)
        if not compared:
            golden = ", ".join(pairing["golden_inputs"]) or "none"
            ours = ", ".join(pairing["target_inputs"]) or "none"
            return finding(
                cid,
                "warn",
                f"the batches cannot be compared with the golden: it recorded root inputs "
                f"{golden}, this target gives {ours}, and the model's forward maps none onto "
                "the other (the two seeded passes agree)",
                evidence,
                "Record the golden with the same target (same batch structure), or write the "
                "data fingerprints next to it (`precguard check --fingerprints-out GOLDEN`) so "
                "batches are compared by content.",
            )
        if mismatch:
            evidence["golden_mismatch"] = mismatch
            return finding(
                cid,
                "fail",
                f"the batches differ from the golden recording's inputs at step "
                f"{mismatch[0]['step']} ({mismatch[0]['input']})",
                evidence,
                _GOLDEN_REMEDY,
            )
        golden_note = f"; they match the golden's root inputs for {compared} step(s)"
    return finding(
        cid,
        "pass",
        f"the first {batches} batches are identical across two seeded passes{golden_note}",
        evidence,
    )


def _stats(t: torch.Tensor) -> dict[str, float]:
    x = t.detach().to("cpu", torch.float64).flatten()
    return {
        "min": x.min().item(),
        "max": x.max().item(),
        "mean": x.mean().item(),
        "l2": x.norm().item(),
        "numel": float(x.numel()),
    }


def forward_positions(model: Any) -> list[str]:
    """Names of the model's positional ``forward`` parameters, in order ([] if unreadable)."""
    try:
        params = inspect.signature(model.forward).parameters.values()
    except (TypeError, ValueError, AttributeError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds]


def canonical_input(name: str, positional: list[str]) -> str:
    """A root input name as a keyword: ``args.0.x`` -> ``kwargs.ids.x`` when param 0 is ``ids``.

    Records name positional inputs ``args.N`` and keyword ones ``kwargs.NAME``; a
    golden recorded with ``model(ids)`` and a run with ``model(ids=...)`` hold the
    same input under two names. The model's forward signature maps one to the other.
    """
    head, _, rest = name.partition(".")
    if head != "args":
        return name
    index, _, tail = rest.partition(".")
    if index.isdigit() and int(index) < len(positional):
        return f"kwargs.{positional[int(index)]}" + (f".{tail}" if tail else "")
    return name


def batch_inputs(batch: Any) -> list[tuple[str, torch.Tensor]]:
    """The root inputs of ``call_model(model, batch)`` named as records name them."""
    if tree.is_mapping(batch):
        return tree.named_tensors(batch, "kwargs")
    return tree.named_tensors(batch if isinstance(batch, tuple) else (batch,), "args")


def _against_golden(
    ctx: CheckContext, batches: list[Any]
) -> tuple[list[dict[str, Any]], int, dict[str, Any]]:
    """Compare the batches' root inputs with the golden's recorded statistics.

    Returns the mismatches, the number of steps in which at least one input was
    compared, and what was (not) paired: input names on both sides, mapped
    through the model's forward signature.
    """
    from precguard.dump.reader import load_run

    assert ctx.golden is not None
    positional = forward_positions(lab(ctx).reference_model())
    run = load_run(ctx.golden)
    wanted: dict[tuple[int, str], Any] = {}
    golden_names: set[str] = set()
    for rec in run.records():
        if (
            (
                rec.module == "root"
                and rec.phase == "forward"
                and rec.role == "input"
                and rec.call == 0
            )
            and rec.step < len(batches)
            and rec.stats is not None
        ):
            golden_names.add(rec.name)
            wanted[(rec.step, canonical_input(rec.name, positional))] = rec.stats
    mismatch: list[dict[str, Any]] = []
    steps = sorted({s for s, _ in wanted})
    ours = {name for name, _ in batch_inputs(batches[0])} if batches else set()
    paired: set[str] = set()
    compared_steps = 0
    for step in steps:
        compared_here = False
        for name, t in batch_inputs(batches[step]):
            stats = wanted.get((step, canonical_input(name, positional)))
            if stats is None:
                continue
            compared_here = True
            paired.add(name)
            mine = _stats(t)
            for key, value in mine.items():
                if getattr(stats, key) is None:  # not recorded (an imported msprobe dump)
                    continue
                theirs = float(getattr(stats, key))
                if not math.isclose(value, theirs, rel_tol=1e-5, abs_tol=1e-6):
                    mismatch.append(
                        {"step": step, "input": name, "stat": key, "golden": theirs, "now": value}
                    )
                    break
        compared_steps += compared_here
    pairing = {
        "golden_inputs": sorted(golden_names),
        "target_inputs": sorted(ours),
        "paired_inputs": sorted(paired),
    }
    return mismatch, compared_steps, pairing


CHECKS = [
    Check(
        "data.batches",
        "The first N batches are identical across two seeded passes (and equal the golden's).",
        batches,
    ),
]
