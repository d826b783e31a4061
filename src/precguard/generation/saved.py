"""One side's decoding saved to a directory, for a reference that sits on another machine.

::

    RUN/
      generation.json          side, decoding options, prompts, tokens fed and chosen
      prompt-{i}.safetensors   that prompt's logits per step (cached and cache-free)
                               and the KV-cache snapshots

No pickle: tensors in safetensors, everything else JSON validated on load.
``precguard generate-diff --save-run GOLDEN`` writes the reference; on the
machine under test ``--save-run ACTUAL --against GOLDEN`` decodes the same
prompts fed the golden's tokens; ``generate-diff GOLDEN ACTUAL`` compares them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from precguard.errors import DumpFormatError, OutputExistsError
from precguard.generation.decode import Decoding
from precguard.generation.report import Side

SAVED_SCHEMA_VERSION = 1
META_FILE = "generation.json"


class SavedPrompt(BaseModel):
    """One prompt of a saved run."""

    model_config = ConfigDict(extra="forbid")

    text: str | None = Field(description="The prompt's text, when it came as text.")
    ids: list[int] = Field(description="Its token ids.")
    chosen: list[int] = Field(description="The token this side chose at each step.")
    fed: list[int] = Field(description="The tokens fed after the prompt, one per step.")
    seconds: float = Field(description="Wall time of the decoding.")
    snapshots: list[str] = Field(description="The cache snapshots saved ('prefill', 'step N').")
    cache_free: bool = Field(description="Whether cache-free logits were saved.")


class SavedRun(BaseModel):
    """``generation.json``: one side's decoding."""

    model_config = ConfigDict(extra="forbid")

    schema_version: int = Field(default=SAVED_SCHEMA_VERSION, description="Format version.")
    side: Side = Field(description="Where and how the model ran.")
    hidden: int | None = Field(description="Hidden size (the logits' reduction length).")
    layers: int = Field(description="Number of residual blocks.")
    steps: int = Field(description="Tokens decoded per prompt.")
    sample: bool = Field(description="Seeded sampling instead of greedy.")
    seed: int = Field(description="Seed of the sampling noise.")
    temperature: float = Field(description="Sampling temperature.")
    against: str | None = Field(description="The saved run whose tokens were fed, if any.")
    prompts: list[SavedPrompt] = Field(description="Per prompt.")


def save_run(
    out: str | os.PathLike[str],
    meta: SavedRun,
    decodings: list[Decoding],
    *,
    overwrite: bool = False,
) -> Path:
    """Write ``meta`` and the tensors of ``decodings`` into the directory ``out``."""
    from safetensors.torch import save_file

    path = Path(out)
    if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
        raise OutputExistsError(f"--save-run {path}: exists and is not empty")
    path.mkdir(parents=True, exist_ok=True)
    for i, d in enumerate(decodings):
        tensors: dict[str, torch.Tensor] = {"scores": d.scores.contiguous()}
        if d.free_scores is not None:
            tensors["free_scores"] = d.free_scores.contiguous()
        for after, entries in d.caches.items():
            for name, t in entries.items():
                tensors[f"cache/{after}/{name}"] = t.contiguous()
        save_file(tensors, str(path / f"prompt-{i}.safetensors"))
    (path / META_FILE).write_text(meta.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return path


def load_run(path: str | os.PathLike[str]) -> tuple[SavedRun, list[Decoding]]:
    """Read a saved run; a missing or malformed file is a :class:`DumpFormatError`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    root = Path(path)
    meta_path = root / META_FILE
    if not meta_path.is_file():
        raise DumpFormatError(f"{root}: not a saved generation run (no {META_FILE})")
    try:
        raw: Any = json.loads(meta_path.read_text(encoding="utf-8"))
        meta = SavedRun.model_validate(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise DumpFormatError(f"{meta_path}: not valid JSON ({exc})") from exc
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise DumpFormatError(f"{meta_path}: {where}: {first['msg']}") from exc
    if meta.schema_version > SAVED_SCHEMA_VERSION:
        raise DumpFormatError(
            f"{meta_path}: schema_version {meta.schema_version} is newer than this precguard's "
            f"({SAVED_SCHEMA_VERSION})"
        )
    decodings = []
    for i, p in enumerate(meta.prompts):
        file = root / f"prompt-{i}.safetensors"
        try:
            tensors = load_file(str(file))
        except (OSError, SafetensorError) as exc:
            raise DumpFormatError(f"{file}: cannot read ({exc})") from exc
        if len(p.chosen) != meta.steps or len(p.fed) != meta.steps:
            raise DumpFormatError(
                f"{meta_path}: prompt {i}: expected {meta.steps} chosen and fed tokens, got "
                f"{len(p.chosen)} and {len(p.fed)}"
            )
        scores = tensors.get("scores")
        if scores is None or scores.dim() != 2 or scores.shape[0] != meta.steps:
            raise DumpFormatError(f"{file}: expected scores [{meta.steps}, vocab]")
        vocab = scores.shape[1]
        if any(not 0 <= t < vocab for t in [*p.chosen, *p.fed]):
            raise DumpFormatError(f"{meta_path}: prompt {i}: a token id outside [0, {vocab})")
        free = tensors.get("free_scores")
        if free is not None and free.shape != scores.shape:
            raise DumpFormatError(
                f"{file}: free_scores {list(free.shape)} != scores {list(scores.shape)}"
            )
        caches: dict[str, dict[str, torch.Tensor]] = {after: {} for after in p.snapshots}
        for key, t in tensors.items():
            if key.startswith("cache/"):
                _, after, name = key.split("/", 2)
                caches.setdefault(after, {})[name] = t
        decodings.append(Decoding(scores.float(), list(p.chosen), caches, free))
    return meta, decodings
