"""One side's decoding saved to a directory, for a reference that sits on another machine.

::

    RUN/
      generation.json          side, decoding options, prompts, tokens fed and chosen
      prompt-{i}.safetensors   that prompt's logits per step (cached and cache-free)
                               and the KV-cache snapshots

No pickle: tensors in safetensors, everything else JSON validated on load
(:mod:`precguard.generation.separate` writes and compares them).
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field

from precguard.dump.atomic import write_atomic
from precguard.dump.tensors import load_safetensors
from precguard.dump.untrusted import (
    Count,
    Finite,
    Int64,
    confine,
    memory_limit,
    read_json_file,
    validated,
)
from precguard.errors import DumpFormatError
from precguard.generation.decode import Decoding
from precguard.generation.report import SideReport
from precguard.text import shown

SAVED_SCHEMA_VERSION = 1
META_FILE = "generation.json"


class SavedPrompt(BaseModel):
    """One prompt of a saved run."""

    model_config = ConfigDict(extra="forbid", strict=True)

    text: str | None = Field(description="The prompt's text, when it came as text.")
    ids: list[Int64] = Field(description="Its token ids.")
    chosen: list[Int64] = Field(description="The token this side chose at each step.")
    fed: list[Int64] = Field(description="The tokens fed after the prompt, one per step.")
    seconds: Finite = Field(description="Wall time of the decoding.")
    snapshots: list[str] = Field(description="The cache snapshots saved ('prefill', 'step N').")
    cache_free: bool = Field(description="Whether cache-free logits were saved.")


class SavedRun(BaseModel):
    """``generation.json``: one side's decoding."""

    model_config = ConfigDict(extra="forbid", strict=True)

    schema_version: int = Field(default=SAVED_SCHEMA_VERSION, description="Format version.")
    side: SideReport = Field(description="Where and how the model ran.")
    hidden: Count | None = Field(description="Hidden size (the logits' reduction length).")
    layers: Count = Field(description="Number of residual blocks.")
    steps: Count = Field(description="Tokens decoded per prompt.")
    sample: bool = Field(description="Seeded sampling instead of greedy.")
    seed: Int64 = Field(description="Seed of the sampling noise.")
    temperature: Finite = Field(description="Sampling temperature.")
    against: str | None = Field(description="The saved run whose tokens were fed, if any.")
    prompts: list[SavedPrompt] = Field(description="Per prompt.")


def save_run(out: str | os.PathLike[str], meta: SavedRun, decodings: list[Decoding]) -> Path:
    """Write ``meta`` and the tensors of ``decodings`` into the directory ``out`` (which
    :func:`~precguard.generation.separate.generate_run` found new or empty)."""
    from safetensors.torch import save_file

    path = Path(out)
    path.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(decodings):
        tensors: dict[str, torch.Tensor] = {"scores": d.scores.contiguous()}
        if d.free_scores is not None:
            tensors["free_scores"] = d.free_scores.contiguous()
        for after, entries in d.caches.items():
            for name, t in entries.items():
                tensors[f"cache/{after}/{name}"] = t.contiguous()
        save_file(tensors, str(path / f"prompt-{i}.safetensors"))
    write_atomic(path / META_FILE, meta.model_dump_json(indent=2) + "\n", what="--save-run")
    return path


#: a device, dtype or target name is short; a longer one is not a name this module wrote
MAX_NAME_CHARS = 256
#: float dtypes a side may name as its compute precision (the near-tie bound is taken from it)
_COMPUTE_DTYPES = frozenset({"float64", "float32", "float16", "bfloat16"})


def load_run(path: str | os.PathLike[str]) -> tuple[SavedRun, list[Decoding]]:
    """Read a saved run; a missing, malformed or inconsistent file is a :class:`DumpFormatError`.

    Read through :mod:`precguard.dump.untrusted`: ``generation.json`` bounded in
    size and nesting and validated strictly (token ids and the seed signed
    64-bit integers, finite floats, no coercion), every file confined to the run
    directory after resolving links and opened only if regular, each prompt
    file's size checked before it is read and its tensors named as this
    module writes them.
    """
    root = Path(path)
    if not root.is_dir():
        raise DumpFormatError(f"{shown(root)}: not a saved generation run (not a directory)")
    where = shown(root / META_FILE)
    meta_path = confine(root, META_FILE, what="saved run", inside="the saved run")
    if not meta_path.exists():
        raise DumpFormatError(f"{shown(root)}: not a saved generation run (no {META_FILE})")
    raw = read_json_file(meta_path, what="saved generation run (generation.json)")
    version = raw.get("schema_version") if isinstance(raw, dict) else None
    if type(version) is not int or not 1 <= version <= SAVED_SCHEMA_VERSION:
        raise DumpFormatError(
            f"{where}: schema_version {shown(repr(version), 40)} is not one this precguard reads "
            f"(1..{SAVED_SCHEMA_VERSION})"
        )
    meta = validated(SavedRun, raw, where=where)
    _check_meta(meta, where)
    # a prompt file is read whole and both runs are held at once, with a float32 copy of
    # each side's scores: one over a quarter of the memory is refused before it is read
    limit = memory_limit() // 4
    decodings = []
    for i, p in enumerate(meta.prompts):
        name = f"prompt-{i}.safetensors"
        shown_file = shown(root / name)
        file = confine(root, name, what=f"prompt {i}", inside="the saved run")
        if not file.exists():
            raise DumpFormatError(f"{shown_file}: missing")
        tensors = load_safetensors(file, shown_path=shown_file, limit=limit)
        if len(p.chosen) != meta.steps or len(p.fed) != meta.steps:
            raise DumpFormatError(
                f"{where}: prompt {i}: expected {meta.steps} chosen and fed tokens, got "
                f"{len(p.chosen)} and {len(p.fed)}"
            )
        scores = tensors.get("scores")
        if (
            scores is None
            or not scores.is_floating_point()
            or scores.dim() != 2
            or scores.shape[0] != meta.steps
            or scores.shape[1] == 0
        ):
            raise DumpFormatError(f"{shown_file}: expected float scores [{meta.steps}, vocab]")
        vocab = scores.shape[1]
        if any(not 0 <= t < vocab for t in [*p.ids, *p.chosen, *p.fed]):
            raise DumpFormatError(f"{where}: prompt {i}: a token id outside [0, {vocab})")
        free = tensors.get("free_scores")
        if free is not None and (free.shape != scores.shape or not free.is_floating_point()):
            raise DumpFormatError(
                f"{shown_file}: free_scores {list(free.shape)} != scores {list(scores.shape)}"
            )
        caches = _caches(tensors, p.snapshots, shown_file)
        decodings.append(Decoding(scores.float(), list(p.chosen), caches, free))
    return meta, decodings


def _check_meta(meta: SavedRun, where: str) -> None:
    """What validation per field cannot see: the fields' agreement."""
    if meta.side.compute_dtype not in _COMPUTE_DTYPES:
        raise DumpFormatError(
            f"{where}: side.compute_dtype {shown(repr(meta.side.compute_dtype), 40)} is not one "
            f"of {sorted(_COMPUTE_DTYPES)}"
        )
    for name in ("device", "dtype", "compute_dtype", "target"):
        if len(getattr(meta.side, name)) > MAX_NAME_CHARS:
            raise DumpFormatError(
                f"{where}: side.{name} is longer than {MAX_NAME_CHARS} characters"
            )
    if meta.sample and not meta.temperature > 0:
        raise DumpFormatError(
            f"{where}: sample is true with temperature {meta.temperature:g}; sampling divides "
            "the logits by the temperature, which must be > 0"
        )
    if not meta.prompts:
        raise DumpFormatError(f"{where}: no prompts: nothing was compared")
    for i, p in enumerate(meta.prompts):
        if not p.ids:
            raise DumpFormatError(f"{where}: prompt {i} has no token ids")


def _caches(
    tensors: dict[str, torch.Tensor], snapshots: list[str], where: str
) -> dict[str, dict[str, torch.Tensor]]:
    """The KV-cache snapshots of one prompt file: ``cache/{after}/{name}`` tensors, by after."""
    caches: dict[str, dict[str, torch.Tensor]] = {after: {} for after in snapshots}
    for key, t in tensors.items():
        if key in ("scores", "free_scores"):
            continue
        parts = key.split("/", 2)
        if len(parts) != 3 or parts[0] != "cache" or not parts[1] or not parts[2]:
            raise DumpFormatError(
                f"{where}: tensor {shown(key, 80)} is not scores, free_scores or "
                "cache/SNAPSHOT/NAME"
            )
        _, after, name = parts
        if after not in caches:
            raise DumpFormatError(
                f"{where}: tensor {shown(key, 80)} is of snapshot {shown(after, 40)}, which "
                "generation.json does not list"
            )
        caches[after][name] = t
    return caches
