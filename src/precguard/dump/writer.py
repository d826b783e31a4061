"""Write a recording directory: manifest, JSONL records, safetensors files.

A run killed at any moment stays readable up to its last flushed step: the
manifest is replaced atomically, a safetensors file is written under a
temporary name and renamed before any record that points to it is written,
and records are appended one line each and flushed per step.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from precguard._logging import get_logger
from precguard.dump.schema import SCHEMA_VERSION, Manifest, RunError
from precguard.errors import OutputExistsError, UsageError

logger = get_logger(__name__)


def _json_float(v: float) -> float | str:
    if math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def prepare_run_dir(path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Create ``path`` for a new recording and return it.

    An existing non-empty directory is refused unless ``overwrite``; then only
    the parts of an earlier recording (``manifest.json``, ``rank*/``) are removed.
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputExistsError(
                f"{out}: directory exists and is not empty (pass --overwrite / overwrite=True)"
            )
        (out / "manifest.json").unlink(missing_ok=True)
        for rank_dir in out.glob("rank*"):
            shutil.rmtree(rank_dir) if rank_dir.is_dir() else rank_dir.unlink()
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / ".precguard-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise UsageError(f"{out}: cannot write here ({exc.strerror or exc})") from exc
    return out


def write_json_atomic(path: Path, data: str) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(data, encoding="utf-8")
    os.replace(tmp, path)


class RunWriter:
    """Writes one rank's part of a recording.

    Rank 0 (or a single process) also writes the manifest.
    """

    def __init__(
        self,
        root: Path,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str = "cpu",
        dtype: str | None = None,
        model: str | None = None,
        target: str | None = None,
        options: dict[str, Any] | None = None,
        fingerprint: dict[str, Any] | None = None,
    ) -> None:
        from precguard import __version__

        self.root = root
        self.rank = rank
        self.rank_dir = root / f"rank{rank}"
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        self.manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            precguard_version=__version__,
            torch_version=torch.__version__,
            device=device,
            dtype=dtype,
            model=model,
            target=target,
            options=options or {},
            fingerprint=fingerprint or {},
            world_size=world_size,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            run_id=uuid.uuid4().hex,
        )
        if rank == 0:
            self._write_manifest()
        self._records = open(self.rank_dir / "records.jsonl", "a", encoding="utf-8")  # noqa: SIM115
        self._chunk = 0

    def _write_manifest(self) -> None:
        write_json_atomic(self.root / "manifest.json", self.manifest.model_dump_json(indent=2))

    def update_manifest(self, **fields: Any) -> None:
        """Change manifest fields (e.g. ``model``, ``dtype``) and rewrite it (rank 0)."""
        self.manifest = self.manifest.model_copy(update=fields)
        if self.rank == 0:
            self._write_manifest()

    def save_tensors(self, tensors: dict[str, torch.Tensor], step: int) -> str:
        """Write ``tensors`` (name → CPU tensor) to a new safetensors file; return its name.

        The file appears under its final name only once complete, so a record
        pointing at it never points at half a file.
        """
        name = f"tensors-{step:06d}-{self._chunk:04d}.safetensors"
        self._chunk += 1
        tmp = self.rank_dir / (name + ".tmp")
        save_file(tensors, str(tmp))
        os.replace(tmp, self.rank_dir / name)
        return name

    def write_records(self, records: list[dict[str, Any]]) -> None:
        """Append ``records`` as JSON lines and flush them to the OS."""
        lines = []
        for rec in records:
            stats = rec.get("stats")
            if stats is not None:
                rec["stats"] = {k: _json_float(v) for k, v in stats.items()}
            lines.append(json.dumps(rec, separators=(",", ":")))
        if lines:
            self._records.write("\n".join(lines) + "\n")
            self._records.flush()

    def close(self, *, steps: int | None = None, error: BaseException | None = None) -> None:
        """Flush and close the records; mark the manifest complete (rank 0).

        With ``error`` (the exception the run's body raised) the manifest says
        ``complete: false`` and names it: what was recorded is kept, but it is
        not the whole run.
        """
        if self._records.closed:
            return
        self._records.close()
        if error is None:
            self.update_manifest(complete=True, steps=steps)
        else:
            failure = RunError(type=type(error).__name__, message=str(error)[:500])
            self.update_manifest(complete=False, steps=steps, error=failure)
