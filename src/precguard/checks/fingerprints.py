"""Data and tokenizer fingerprints stored next to a golden recording (``fingerprints.json``).

A recording holds statistics of the model's inputs, not the tokens or the
batches themselves. To check later that a run sees *exactly* the golden's
data and tokens, write the target's fingerprints into the golden directory
once, on the trusted machine::

    precguard record --target T --device cuda --out runs/golden
    precguard check --checklist quick --target T --fingerprints-out runs/golden

``data.batches`` and ``tokenizer.matches_golden`` then compare hashes of the
first batches (order, content, padding) and of the token ids of the same
texts against it whenever ``--golden runs/golden`` is given.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from precguard.errors import DumpFormatError

FILE_NAME = "fingerprints.json"
SCHEMA_VERSION = 1


class TokenizerFingerprint(BaseModel):
    """Token ids of sample texts and the special-token setup."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    texts: list[str] = Field(description="The texts that were encoded.")
    ids: list[list[int]] = Field(description="Token ids of each text (encode(text)).")
    special: dict[str, int | None] = Field(description="bos/eos/pad/unk token ids.")
    padding_side: str | None = Field(default=None, description="The tokenizer's padding side.")


class Fingerprints(BaseModel):
    """What a run's inputs were, as hashes: written next to a golden recording."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = Field(default=SCHEMA_VERSION, description="Format version.")
    target: str = Field(description="Target the fingerprints were taken from.")
    seed: int = Field(description="Seed the batches were drawn with.")
    batches: list[str] = Field(description="Content hash of each of the first batches.")
    samples: list[list[str]] = Field(description="Per batch, a hash of each sample (row).")
    padding: list[str] = Field(
        default_factory=list,
        description="Per batch, a hash of its attention/padding masks ('' when it has none).",
    )
    tokenizer: TokenizerFingerprint | None = Field(
        default=None, description="Token ids of the sample texts, when the target has a tokenizer."
    )


def take(target: Any, batches: int = 4) -> Fingerprints:
    """Fingerprint a target's first ``batches`` batches (seeded) and its tokenizer."""
    from precguard.checks._lab import seed_everything, value_hash
    from precguard.checks.data import padding_hash, sample_hashes
    from precguard.checks.tokenizer import SAMPLE_TEXTS, encode, special_ids
    from precguard.runner import resolve_backend

    seed_everything(resolve_backend("cpu"), target.seed)
    drawn = [target.batch(step) for step in range(batches)]
    tok_fp = None
    if target.tokenizer is not None:
        tok = target.tokenizer()
        texts = list(target.texts) or list(SAMPLE_TEXTS)
        tok_fp = TokenizerFingerprint(
            texts=texts,
            ids=[encode(tok, t) for t in texts],
            special=special_ids(tok),
            padding_side=getattr(tok, "padding_side", None),
        )
    return Fingerprints(
        target=target.name,
        seed=target.seed,
        batches=[value_hash(b) for b in drawn],
        samples=[sample_hashes(b) for b in drawn],
        padding=[padding_hash(b) for b in drawn],
        tokenizer=tok_fp,
    )


def write(directory: str | os.PathLike[str], target: Any, batches: int = 4) -> Path:
    """Write ``fingerprints.json`` for ``target`` into ``directory``; return its path."""
    from precguard.dump.writer import write_json_atomic

    path = Path(directory) / FILE_NAME
    path.parent.mkdir(parents=True, exist_ok=True)
    # atomic replace: a fingerprints.json that is a link is replaced, never written through
    write_json_atomic(path, take(target, batches).model_dump_json(indent=2) + "\n")
    return path


def read(directory: str | os.PathLike[str] | None) -> Fingerprints | None:
    """The fingerprints stored in ``directory``, or None when there are none."""
    if directory is None:
        return None
    from precguard.dump.paths import resolve_member

    # beside a recording, so by the recording's path rules (no link leading out)
    path = resolve_member(Path(directory), FILE_NAME, what="fingerprints")
    if not path.is_file():
        return None
    try:
        return Fingerprints.model_validate_json(path.read_bytes())
    except ValidationError as exc:
        from precguard.dump.reader import first_error

        raise DumpFormatError(f"{path}: {first_error(exc)}") from exc
