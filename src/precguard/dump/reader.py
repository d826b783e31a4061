"""Read a recording directory without ever unpickling anything.

A recording is untrusted input, read through :mod:`precguard.dump.untrusted`
like every other file precguard reads. Every file name read from it goes through
:func:`~precguard.dump.paths.resolve_member` (nothing outside the directory is
read), only regular files are opened, every JSON document is parsed with a
bounded nesting depth and size,
records are streamed with memory flat in their number, and what does not hold
together (a duplicated record, a step going back, a rank field that is not the
folder's, a tensor file whose dtype or shape is not the record's, a records
file that ends before the steps the manifest counts) is refused with a
:class:`~precguard.errors.DumpFormatError` naming the file and line.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from precguard._logging import get_logger
from precguard.dump.paths import (
    RECORDS_FILE,
    STATUS_FILE,
    rank_dir,
    rank_dir_name,
    rank_of,
    resolve_member,
)
from precguard.dump.schema import SCHEMA_VERSION, Manifest, RankStatus, Record
from precguard.dump.shared_fields import share_fields_set
from precguard.dump.step_records import StepRecords
from precguard.dump.tensors import TensorStore
from precguard.dump.untrusted import (
    MAX_DOCUMENT_BYTES,
    MAX_LINE_BYTES,
    first_error,
    iter_json_lines_at,
    read_json_file,
)
from precguard.errors import DumpFormatError
from precguard.text import shown

if TYPE_CHECKING:
    import torch

logger = get_logger(__name__)

__all__ = ["Run", "check_schema_version", "first_error", "load_run", "read_json_file"]

#: a manifest larger than this is not one precguard wrote
MAX_MANIFEST_BYTES = MAX_DOCUMENT_BYTES
#: a records line longer than this is not one precguard wrote (shapes and names are short)
MAX_RECORD_LINE_BYTES = MAX_LINE_BYTES
#: more ranks than any job runs: a manifest claiming more is refused before anything
#: iterates over them (a claimed 10**8 would otherwise build a set of 10**8 ranks)
MAX_WORLD_SIZE = 1 << 17


class Run:
    """A recording on disk. Cheap to open; records are streamed, tensors memory-mapped."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise DumpFormatError(f"{shown(self.path)}: no such recording directory")
        mpath = resolve_member(self.path, "manifest.json", what="manifest")
        if not mpath.is_file():
            raise DumpFormatError(
                f"{shown(self.path / 'manifest.json')}: missing; is {shown(self.path)} a "
                "precguard recording?"
            )
        shown_path = shown(self.path / "manifest.json")
        raw = read_json_file(mpath, limit=MAX_MANIFEST_BYTES, what="precguard manifest")
        if not isinstance(raw, dict):
            raise DumpFormatError(f"{shown_path}: expected a JSON object")
        check_schema_version(raw.get("schema_version"), shown_path)
        try:
            self.manifest = Manifest.model_validate(raw)
        except ValidationError as exc:
            raise DumpFormatError(f"{shown_path}: {first_error(exc)}") from exc
        if not 1 <= self.manifest.world_size <= MAX_WORLD_SIZE:
            raise DumpFormatError(
                f"{shown_path}: world_size {shown(str(self.manifest.world_size), 40)} is "
                f"outside 1..{MAX_WORLD_SIZE}; not a run precguard recorded"
            )

    def __repr__(self) -> str:
        return f"Run({str(self.path)!r}, device={self.manifest.device!r})"

    @cached_property
    def ranks(self) -> list[int]:
        """Ranks that have a records file, sorted.

        A rank folder is ``rank`` and ASCII digits (``rank0``, ``rank12``);
        other names are not rank folders. One that leads outside the recording
        (a symbolic link) is refused.
        """
        found = []
        try:
            entries = sorted(os.listdir(self.path))
        except OSError as exc:
            raise DumpFormatError(
                f"{shown(self.path)}: cannot list ({exc.strerror or exc})"
            ) from exc
        for name in entries:
            rank = rank_of(name)
            if rank is None:
                continue
            records = resolve_member(
                self.path, f"{name}/{RECORDS_FILE}", what=f"rank folder {name}"
            )
            if records.is_file():
                found.append(rank)
        return sorted(found)

    def rank_status(self) -> dict[int, RankStatus | None]:
        """Each rank's own account of how it ended (``rank{R}/status.json``).

        Covers every rank of the manifest's ``world_size`` and every rank
        folder found: None for a rank that wrote no status (a recording made
        before ranks kept one, or a rank that never started). A rank whose
        status says ``complete: false`` was killed, is still running, or raised
        (then ``error`` says what).
        """
        out: dict[int, RankStatus | None] = {}
        claimed = range(self.manifest.world_size)  # bounded by MAX_WORLD_SIZE on open
        for rank in sorted(set(claimed).union(self.ranks)):
            path = resolve_member(
                self.path, f"{rank_dir_name(rank)}/{STATUS_FILE}", what=f"rank {rank}"
            )
            if not path.is_file():
                out[rank] = None
                continue
            raw = read_json_file(path, limit=MAX_MANIFEST_BYTES, what="rank status")
            try:
                out[rank] = RankStatus.model_validate(raw)
            except ValidationError as exc:
                raise DumpFormatError(
                    f"{shown(rank_dir(self.path, rank) / STATUS_FILE)}: {first_error(exc)}"
                ) from exc
        return out

    def completed_ranks(self) -> list[int]:
        """Ranks whose status says they closed cleanly (see :meth:`rank_status`)."""
        return [r for r, s in self.rank_status().items() if s is not None and s.complete]

    def records(self, rank: int | None = None) -> Iterator[Record]:
        """Stream records of one rank (default: every rank, in rank order).

        A truncated last line (the run was killed mid-write) is skipped with a
        warning; any other malformed line raises DumpFormatError naming it, as
        does a record that contradicts the ones before it (see the module doc).
        """
        ranks = self.ranks if rank is None else [rank]
        for r in ranks:
            yield from self._read_rank(r)

    def steps(self, rank: int) -> Iterator[StepRecords]:
        """Stream one rank's records a step at a time, each step as a
        :class:`~precguard.dump.step_records.StepRecords`: where its records lie in the
        file, read again when used, so a step of millions of records costs megabytes to
        hold. Every record is checked as :meth:`records` checks it."""
        path, shown_path = self._records_file(rank)
        current: StepRecords | None = None
        for offset, rec in self._read_rank_at(rank):
            if current is None or rec.step != current.step:
                if current is not None:
                    yield current
                current = StepRecords(path, shown_path, rec.step)
            current.add(offset, rec)
        if current is not None:
            yield current

    def _records_file(self, rank: int) -> tuple[Path, str]:
        shown_path = shown(rank_dir(self.path, rank) / RECORDS_FILE)
        path = resolve_member(
            self.path, f"{rank_dir_name(rank)}/{RECORDS_FILE}", what=f"rank {rank}"
        )
        if not path.is_file():
            raise DumpFormatError(f"{shown_path}: missing")
        return path, shown_path

    def _read_rank(self, rank: int) -> Iterator[Record]:
        for _offset, rec in self._read_rank_at(rank):
            share_fields_set(rec)  # a caller may hold them all: 1.4 KB less each
            yield rec

    def _read_rank_at(self, rank: int) -> Iterator[tuple[int, Record]]:
        path, shown_path = self._records_file(rank)
        checker = _Consistency(shown_path, rank)
        # one line at a time (memory flat in the file), each at most MAX_RECORD_LINE_BYTES
        for lineno, offset, line in iter_json_lines_at(
            path, what="precguard record", max_line=MAX_RECORD_LINE_BYTES
        ):
            if line is None:  # only the last line can lack its newline: a write cut short
                logger.warning("truncated_last_line_skipped", file=shown_path, line=lineno)
                break
            try:
                rec = Record.model_validate_json(line)
            except ValidationError as exc:
                raise DumpFormatError(
                    f"{shown_path} line {lineno}: {_line_problem(line, exc)}"
                ) from None
            checker.check(rec, lineno)
            yield offset, rec
        checker.check_end(self.manifest)

    def tensor(self, record: Record) -> torch.Tensor:
        """Load the full tensor saved for ``record``, as a tensor of its own.

        Read through the same store compare and replay use
        (:class:`~precguard.dump.tensors.TensorStore`): the file is found with
        the recording's path rules, its header is validated, and the tensor's
        dtype and shape must be the record's. The result is a copy, so it stays
        valid and writable after the run's files are closed.
        """
        return self.tensors.tensor(record).clone()

    @cached_property
    def tensors(self) -> TensorStore:
        """The run's tensor store: zero-copy, memory-mapped views of saved tensors."""
        return TensorStore(self.path)


def _line_problem(line: bytes, exc: ValidationError) -> str:
    """What is wrong with a records line that did not validate (the slow path only)."""
    try:
        line.decode("utf-8")
    except UnicodeDecodeError:
        return "not valid UTF-8"
    if exc.errors()[0]["type"].startswith("json"):
        return "expected a JSON object, got malformed JSON"
    return first_error(exc)


def check_schema_version(version: object, where: str) -> None:
    """Accept only a JSON integer schema version this precguard reads.

    ``"2"``, ``2.0`` and ``true`` are refused rather than coerced: a coerced
    value could slip a newer format past the check.
    """
    if type(version) is not int:
        raise DumpFormatError(
            f"{where}: schema_version must be an integer, got {shown(repr(version), 40)}"
        )
    if version > SCHEMA_VERSION:
        raise DumpFormatError(
            f"{where}: schema_version {version} is newer than this precguard reads "
            f"({SCHEMA_VERSION}); upgrade precguard"
        )
    if version < 1:
        raise DumpFormatError(f"{where}: schema_version {version} is not a precguard version")


class _Consistency:
    """What one rank's records must satisfy, checked as they stream by (O(1) per record).

    ``seq`` strictly increases (a duplicated or re-ordered line is refused at
    once, so a file of a million copies of one line costs one line of memory),
    ``step`` never goes back, ``rank`` is the folder's, and no size is negative.

    A key may repeat within a step: with gradient accumulation a parameter's
    gradient is recorded once per backward pass under the same key.
    """

    __slots__ = ("last_seq", "last_step", "path", "rank")

    def __init__(self, path: str, rank: int) -> None:
        self.path = path
        self.rank = rank
        self.last_seq = -1
        self.last_step = -1

    def check(self, rec: Record, lineno: int) -> None:
        """Refuse ``rec`` if it contradicts the records before it; else remember it."""
        seq, step, shape = rec.seq, rec.step, rec.shape
        # the common case in one test: this runs for every record of every read
        if (
            seq > self.last_seq
            and step >= self.last_step
            and rec.rank == self.rank
            and (not shape or min(shape) >= 0)
        ):
            self.last_seq, self.last_step = seq, step
            return
        where = f"{self.path} line {lineno}"
        if rec.rank != self.rank:
            raise DumpFormatError(
                f"{where}: record of rank {rec.rank} in the rank {self.rank} file"
            )
        if rec.seq <= self.last_seq:
            raise DumpFormatError(
                f"{where}: seq {rec.seq} after {self.last_seq}: a duplicated or re-ordered record"
            )
        if rec.step < self.last_step:
            raise DumpFormatError(f"{where}: step {rec.step} after step {self.last_step}")
        raise DumpFormatError(f"{where}: negative size in shape {shown(rec.shape, 60)}")

    def check_end(self, manifest: Manifest) -> None:
        """A run that closed cleanly has records up to its last step; fewer is a cut file."""
        if self.rank != 0 or not manifest.complete or not manifest.steps:
            return
        if self.last_step + 1 < manifest.steps:
            ends = "has no records" if self.last_step < 0 else f"ends in step {self.last_step}"
            raise DumpFormatError(
                f"{self.path}: truncated: the file {ends} but the manifest says the run "
                f"completed {manifest.steps} step(s)"
            )


def load_run(path: str | os.PathLike[str]) -> Run:
    """Open a recording directory.

    >>> run = load_run("runs/golden")            # doctest: +SKIP
    >>> next(run.records()).key                  # doctest: +SKIP
    'model.embed_tokens.0.forward.input.0'
    """
    return Run(path)
