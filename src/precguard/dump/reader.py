"""Read a recording directory without ever unpickling anything."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path

import torch
from pydantic import ValidationError

from precguard._logging import get_logger
from precguard.dump.schema import SCHEMA_VERSION, Manifest, Record
from precguard.errors import DumpFormatError

logger = get_logger(__name__)


class Run:
    """A recording on disk. Cheap to open; records are streamed, tensors memory-mapped."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise DumpFormatError(f"{self.path}: no such recording directory")
        mpath = self.path / "manifest.json"
        if not mpath.is_file():
            raise DumpFormatError(f"{mpath}: missing; is {self.path} a precguard recording?")
        try:
            raw = json.loads(mpath.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DumpFormatError(f"{mpath}: not valid JSON ({exc})") from exc
        if not isinstance(raw, dict):
            raise DumpFormatError(f"{mpath}: expected a JSON object")
        version = raw.get("schema_version")
        if isinstance(version, int) and version > SCHEMA_VERSION:
            raise DumpFormatError(
                f"{mpath}: schema_version {version} is newer than this precguard reads "
                f"({SCHEMA_VERSION}); upgrade precguard"
            )
        try:
            self.manifest = Manifest.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            loc = ".".join(str(p) for p in first["loc"])
            raise DumpFormatError(f"{mpath}: field '{loc}': {first['msg']}") from exc
        self._open_files: dict[Path, object] = {}

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, device={self.manifest.device!r})"

    @cached_property
    def ranks(self) -> list[int]:
        """Ranks that have a records file, sorted."""
        found = []
        for d in self.path.glob("rank*"):
            if d.is_dir() and d.name[4:].isdigit() and (d / "records.jsonl").is_file():
                found.append(int(d.name[4:]))
        return sorted(found)

    def records(self, rank: int | None = None) -> Iterator[Record]:
        """Stream records of one rank (default: every rank, in rank order).

        A truncated last line (the run was killed mid-write) is skipped with a
        warning; any other malformed line raises DumpFormatError naming it.
        """
        ranks = self.ranks if rank is None else [rank]
        for r in ranks:
            yield from self._read_rank(r)

    def _read_rank(self, rank: int) -> Iterator[Record]:
        path = self.path / f"rank{rank}" / "records.jsonl"
        if not path.is_file():
            raise DumpFormatError(f"{path}: missing")
        with open(path, encoding="utf-8", errors="strict") as fh:
            lineno = 0
            pending: str | None = None
            for line in fh:
                lineno += 1
                if pending is not None:
                    raise DumpFormatError(f"{path} line {lineno - 1}: {pending}")
                if not line.endswith("\n"):
                    # Only the last line can lack its newline: a write cut short.
                    logger.warning("truncated_last_line_skipped", file=str(path), line=lineno)
                    return
                if not line.strip():
                    continue
                try:
                    yield Record.model_validate_json(line)
                except ValidationError as exc:
                    err = exc.errors()[0]
                    if err["type"].startswith("json"):
                        pending = "expected a JSON object, got malformed JSON"
                    else:
                        loc = ".".join(str(p) for p in err["loc"])
                        pending = f"field '{loc}': {err['msg']}"
            if pending is not None:
                raise DumpFormatError(f"{path} line {lineno}: {pending}")

    def tensor(self, record: Record) -> torch.Tensor:
        """Load the full tensor saved for ``record`` (memory-mapped safetensors)."""
        if record.tensor is None:
            raise DumpFormatError(f"{self.path}: record {record.key} has no saved tensor")
        from safetensors import SafetensorError, safe_open

        fpath = self.path / f"rank{record.rank}" / record.tensor.file
        handle = self._open_files.get(fpath)
        try:
            if handle is None:
                if not fpath.is_file():
                    raise DumpFormatError(f"{fpath}: missing (referenced by {record.key})")
                handle = safe_open(str(fpath), framework="pt")
                self._open_files[fpath] = handle
            return handle.get_tensor(record.tensor.name)  # type: ignore[attr-defined]
        except SafetensorError as exc:
            raise DumpFormatError(f"{fpath}: unreadable safetensors file ({exc})") from exc


def load_run(path: str | os.PathLike[str]) -> Run:
    """Open a recording directory.

    >>> run = load_run("runs/golden")            # doctest: +SKIP
    >>> next(run.records()).key                  # doctest: +SKIP
    'model.embed_tokens.0.forward.input.0'
    """
    return Run(path)
