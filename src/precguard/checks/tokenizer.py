"""``tokenizer`` checks: ids that round-trip, special tokens in place, ids inside the embedding.

A tokenizer that differs between the two runs (another revision, another
padding side, a missing BOS) changes every number downstream; an id beyond
the embedding table reads garbage on one device and raises on another.
"""

from __future__ import annotations

from typing import Any

from precguard.checks import fingerprints
from precguard.checks._lab import lab
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding
from precguard.checks.fingerprints import SAMPLE_TEXTS, encode, special_ids


def _texts(ctx: CheckContext) -> list[str]:
    target = lab(ctx).target
    return list(target.texts) or list(SAMPLE_TEXTS)


def _decode(tok: Any, ids: list[int]) -> str:
    try:
        return str(tok.decode(ids, skip_special_tokens=True))
    except TypeError:
        return str(tok.decode(ids))


def round_trip(ctx: CheckContext) -> Finding:
    """Encode then decode each sample text; the text must come back unchanged."""
    tok = lab(ctx).tokenizer()
    cid = "tokenizer.round_trip"
    exact, normalised, broken = 0, [], []
    special = {v for v in special_ids(tok).values() if v is not None}
    for text in _texts(ctx):
        ids = [i for i in encode(tok, text) if i not in special]
        back = _decode(tok, ids)
        if back == text:
            exact += 1
        elif " ".join(back.split()) == " ".join(text.split()):
            normalised.append(text)
        else:
            broken.append({"text": text[:80], "decoded": back[:80]})
    evidence = {"texts": exact + len(normalised) + len(broken), "exact": exact}
    if broken:
        evidence["broken"] = broken[:5]
        return finding(
            cid,
            "fail",
            f"{len(broken)} text(s) do not survive encode/decode, e.g. "
            f"{broken[0]['text']!r} -> {broken[0]['decoded']!r}",
            evidence,
            "Use the tokenizer files the model was trained with (same revision, same "
            "vocabulary and merges, same normaliser); unknown characters becoming UNK or "
            "bytes dropped mean the data both runs see is not the text you think.",
        )
    if normalised:
        evidence["whitespace_normalised"] = normalised[:5]
        return finding(
            cid,
            "warn",
            f"{len(normalised)} text(s) come back with whitespace changed",
            evidence,
            "Check that both runs use the same normaliser and `clean_up_tokenization_spaces` "
            "setting; otherwise decoded generations will not compare equal.",
        )
    return finding(cid, "pass", f"all {exact} sample texts round-trip exactly", evidence)


def special_tokens(ctx: CheckContext, padding_side: str | None = None) -> Finding:
    """BOS/EOS/PAD ids set and distinct, BOS added once, padding on the expected side."""
    tok = lab(ctx).tokenizer()
    cid = "tokenizer.special_tokens"
    ids = special_ids(tok)
    side = getattr(tok, "padding_side", None)
    evidence: dict[str, Any] = {
        **{f"{k}_token_id": v for k, v in ids.items()},
        "padding_side": side,
    }
    problems: list[str] = []
    warnings: list[str] = []
    text = _texts(ctx)[0]
    encoded = encode(tok, text)
    if ids["bos"] is not None:
        evidence["starts_with_bos"] = bool(encoded) and encoded[0] == ids["bos"]
        if encoded[:2] == [ids["bos"], ids["bos"]]:
            problems.append("BOS is added twice")
    if ids["eos"] is None:
        warnings.append("no EOS token: generations cannot stop and packed samples run together")
    if ids["pad"] is None:
        warnings.append("no PAD token: batches cannot be padded (HF falls back to EOS)")
    elif ids["pad"] == ids["eos"]:
        warnings.append(
            "PAD equals EOS: masking padding in the labels also masks every EOS, so the "
            "model never learns to stop"
        )
    if padding_side is not None and side is not None and side != padding_side:
        warnings.append(f"padding side is {side!r}, expected {padding_side!r}")
    remedy = (
        "Set the special tokens explicitly and identically in both runs: "
        "tokenizer.pad_token = <a dedicated token> (resize the embedding if new), "
        f"tokenizer.padding_side = {padding_side or 'right'!r} "
        "('left' for batched generation with a decoder-only model), and add BOS exactly once "
        "(either add_special_tokens=True or a chat template, not both)."
    )
    if problems:
        return finding(cid, "fail", "; ".join(problems), evidence, remedy)
    if warnings:
        return finding(cid, "warn", "; ".join(warnings), evidence, remedy)
    return finding(cid, "pass", "BOS/EOS/PAD are set and distinct, BOS is added once", evidence)


def vocab_range(ctx: CheckContext) -> Finding:
    """Every id the tokenizer produces (and every special id) is below the embedding size."""
    bench = lab(ctx)
    tok = bench.tokenizer()
    cid = "tokenizer.vocab_range"
    rows = bench.embedding_size()
    if rows is None:
        raise NotApplicable("the model has no input embedding to index")
    produced = [i for text in _texts(ctx) for i in encode(tok, text)]
    specials = [v for v in special_ids(tok).values() if v is not None]
    size = len(tok) if hasattr(tok, "__len__") else getattr(tok, "vocab_size", None)
    top = max([*produced, *specials], default=-1)
    evidence = {
        "embedding_rows": rows,
        "tokenizer_size": size,
        "max_id_produced": max(produced, default=None),
        "max_special_id": max(specials, default=None),
        "negative_ids": sum(i < 0 for i in produced),
    }
    remedy = (
        f"Resize the embedding to the tokenizer (model.resize_token_embeddings(len(tokenizer))) "
        f"or use the tokenizer that matches the checkpoint: ids >= {rows} read past the "
        "embedding table (garbage or a device-side assert) and are silently clamped on some "
        "chips."
    )
    if top >= rows or evidence["negative_ids"]:
        over = sorted({i for i in [*produced, *specials] if i >= rows})
        evidence["ids_out_of_range"] = over[:20]
        return finding(
            cid,
            "fail",
            f"the tokenizer produces id {top} but the embedding has only {rows} rows",
            evidence,
            remedy,
        )
    if isinstance(size, int) and size > rows:
        return finding(
            cid,
            "warn",
            f"the tokenizer has {size} tokens but the embedding only {rows} rows; the sample "
            "texts stayed in range",
            evidence,
            remedy,
        )
    return finding(
        cid, "pass", f"all ids (max {top}) are below the embedding size {rows}", evidence
    )


def matches_golden(ctx: CheckContext) -> Finding:
    """Token ids of the golden's texts and the special tokens equal the golden's fingerprints."""
    cid = "tokenizer.matches_golden"
    if ctx.golden is None:
        raise NotApplicable("no golden recording given (--golden DIR)")
    stored = fingerprints.read(ctx.golden)
    if stored is None or stored.tokenizer is None:
        raise NotApplicable(
            f"the golden has no tokenizer fingerprints ({fingerprints.FILE_NAME}); write them "
            "with `precguard check --target T --fingerprints-out GOLDEN_DIR`"
        )
    tok = lab(ctx).tokenizer()
    golden = stored.tokenizer
    differing = []
    for text, ids in zip(golden.texts, golden.ids, strict=True):
        now = encode(tok, text)
        if now != ids:
            first = next(
                (i for i, (a, b) in enumerate(zip(now, ids, strict=False)) if a != b), None
            )
            differing.append(
                {
                    "text": text[:60],
                    "first_difference_at": first,
                    "now": now[:12],
                    "golden": ids[:12],
                }
            )
    special_now = special_ids(tok)
    special_diff = {
        k: [special_now.get(k), v] for k, v in golden.special.items() if special_now.get(k) != v
    }
    side = getattr(tok, "padding_side", None)
    evidence: dict[str, Any] = {
        "texts": len(golden.texts),
        "differing_texts": differing[:5],
        "special_now_vs_golden": special_diff,
        "padding_side_now_vs_golden": [side, golden.padding_side],
    }
    remedy = (
        "Load the exact tokenizer files of the golden run (same revision: tokenizer.json, "
        "vocab/merges, special_tokens_map, tokenizer_config) and the same padding side."
    )
    if differing or special_diff:
        what = (
            f"{len(differing)} of {len(golden.texts)} texts encode to other ids"
            if differing
            else f"special tokens differ: {special_diff}"
        )
        return finding(
            cid, "fail", f"the tokenizer differs from the golden's: {what}", evidence, remedy
        )
    if side != golden.padding_side:
        return finding(
            cid,
            "warn",
            f"padding side {side!r} differs from the golden's {golden.padding_side!r}",
            evidence,
            remedy,
        )
    return finding(
        cid,
        "pass",
        f"the {len(golden.texts)} golden texts encode to the golden's ids; special tokens match",
        evidence,
    )


CHECKS = [
    Check("tokenizer.round_trip", "Encode/decode of sample texts gives the text back.", round_trip),
    Check(
        "tokenizer.special_tokens",
        "BOS/EOS/PAD are set and distinct; BOS added once; padding side as expected.",
        special_tokens,
    ),
    Check(
        "tokenizer.vocab_range",
        "Every produced id is below the model's embedding size.",
        vocab_range,
    ),
    Check(
        "tokenizer.matches_golden",
        "With --golden and its fingerprints.json: the same token ids and special tokens.",
        matches_golden,
    ),
]
