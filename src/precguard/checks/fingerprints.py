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

import ctypes
import hashlib
import os
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from precguard import tree
from precguard.checks._lab import flatten
from precguard.devices import resolve_backend, seed_everything
from precguard.errors import DumpFormatError

FILE_NAME = "fingerprints.json"
SCHEMA_VERSION = 1

SAMPLE_TEXTS: tuple[str, ...] = (
    "The quick brown fox jumps over the lazy dog.",
    "  leading and trailing spaces  ",
    "Numbers 3.14159, 2**16 = 65536; tabs\tand\nnewlines.",
    "中文分词测试：精度对齐。",
    "def f(x):\n    return x ** 2  # code",
)
#: batch leaves whose path names one of these are masks (:func:`padding_hash`)
_PAD_KEYS = ("attention_mask", "padding_mask")


# -- what is hashed -------------------------------------------------------------------


def tensor_hash(tensor: torch.Tensor) -> str:
    """A short content hash of a tensor (dtype, shape and bytes)."""
    t = tensor.detach().to("cpu").contiguous()
    h = hashlib.sha256(f"{t.dtype}{list(t.shape)}".encode())
    # the bytes copied from the tensor's memory (not .numpy(), which would leave the
    # caller's storage non-resizable for good)
    h.update(ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b"")
    return h.hexdigest()[:16]


def value_hash(value: Any) -> str:
    """Hash every tensor and plain value in a nested batch (dict/tuple/list/tensor)."""
    h = hashlib.sha256()
    for path, leaf in flatten(value):
        h.update(path.encode())
        h.update(
            tensor_hash(leaf).encode() if isinstance(leaf, torch.Tensor) else repr(leaf).encode()
        )
    return h.hexdigest()[:16]


def sample_hashes(batch: Any) -> list[str]:
    """One hash per sample of a batch (row i of every tensor leaf, for each i)."""
    leaves = [(p, t) for p, t in flatten(batch) if isinstance(t, torch.Tensor) and t.dim() > 0]
    if not leaves:
        return []
    n = min(t.shape[0] for _, t in leaves)
    return ["".join(tensor_hash(t[i]) for _, t in leaves) for i in range(n)]


def padding_hash(batch: Any) -> str:
    """A hash of the batch's attention/padding masks, or '' when it has none."""
    masks = [
        t
        for p, t in flatten(batch)
        if isinstance(t, torch.Tensor) and any(k in p for k in _PAD_KEYS)
    ]
    return "".join(tensor_hash(m) for m in masks)


def encode(tok: Any, text: str, **kwargs: Any) -> list[int]:
    """Token ids of ``text``, from a transformers tokenizer or a ``tokenizers`` one."""
    ids = tok.encode(text, **kwargs)
    if hasattr(ids, "ids"):  # a `tokenizers` Encoding
        ids = ids.ids
    if tree.is_mapping(ids):  # a BatchEncoding
        ids = ids["input_ids"]
    return [int(i) for i in ids]


def special_ids(tok: Any) -> dict[str, int | None]:
    """The bos/eos/pad/unk token ids of ``tok`` (None where it has none)."""
    return {name: getattr(tok, f"{name}_token_id", None) for name in ("bos", "eos", "pad", "unk")}


# -- the file ---------------------------------------------------------------------------


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
