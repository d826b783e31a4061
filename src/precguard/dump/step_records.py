"""One rank's records of one step, kept as where they lie in ``records.jsonl``.

compare takes a step at a time; a step of a big run holds millions of records,
and a parsed :class:`~precguard.dump.schema.Record` costs about 2 KB of memory.
:class:`StepRecords` keeps, per record, the byte offset of its line and two
hashes of its names (24 bytes), and reads a record again from the file each
time it is used: a sequence of records that costs almost nothing to hold and a
parse (some microseconds) to read. What a reader looks for among the records
(saved tensors, buffers, collectives, the root's forward records) is counted
as they are first read, so it need not read them all again to learn there are
none. The reader checked every line on the first
read; a line that no longer parses, or is of another step, when read again
means the file changed under the comparison, and is refused.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO, overload

import numpy as np
from pydantic import ValidationError

from precguard.dump.schema import Record
from precguard.dump.untrusted import MAX_LINE_BYTES, open_regular
from precguard.errors import DumpFormatError

__all__ = ["StepRecords"]

#: the roles whose records align by their recorded name (compare/align.py)
_CALL_IO = ("input", "output")


class StepRecords(Sequence[Record]):
    """The records of one rank and step, read from their file when used (the module doc).

    >>> for step in run.steps(0):                    # doctest: +SKIP
    ...     step.step, len(step), step[0].key
    """

    __slots__ = (
        "_io",
        "_keys",
        "_offsets",
        "_path",
        "_roots",
        "_shown",
        "buffers",
        "collectives",
        "step",
        "tensors",
    )

    def __init__(self, path: Path, shown_path: str, step: int) -> None:
        self._path = path
        self._shown = shown_path
        #: the step every record is of
        self.step = step
        self._offsets = array("q")
        #: per record, hash(key); and hash of what pairs it by name (call and name) for a
        #: named call input or output, else hash(key)
        self._keys = array("q")
        self._io = array("q")
        #: the offsets of the root module's forward records (where padding masks are)
        self._roots = array("q")
        #: how many records have a saved tensor, are buffers, record a collective: what a
        #: reader that looks only for those need not read every record to learn
        self.tensors = 0
        self.buffers = 0
        self.collectives = 0

    def add(self, offset: int, rec: Record) -> None:
        """Take in the record read at ``offset`` (the reader, in file order)."""
        self._offsets.append(offset)
        key = hash(rec.key)
        self._keys.append(key)
        if rec.role in _CALL_IO and rec.name:
            self._io.append(hash((rec.module, rec.call, rec.phase, rec.role, rec.name)))
        else:
            self._io.append(key)
        if rec.module == "root" and rec.phase == "forward":
            self._roots.append(offset)
        self.tensors += rec.tensor is not None
        self.buffers += rec.role == "buffer"
        self.collectives += rec.collective is not None

    def names_like(self, other: StepRecords) -> bool:
        """Whether ``other`` holds records of the same keys and call names in the same order,
        each key and each (call, name) once (hashes: equal hashes still need the names
        compared, as the one who pairs them does)."""
        if self._keys != other._keys or self._io != other._io:
            return False
        return _distinct(self._keys) and _distinct(self._io)

    def forward_roots(self) -> list[Record]:
        """The root module's forward records, in order (the others are not read)."""
        with self._open() as fh:
            return [self._read(fh, o) for o in self._roots]

    def __len__(self) -> int:
        return len(self._offsets)

    @overload
    def __getitem__(self, index: int) -> Record: ...

    @overload
    def __getitem__(self, index: slice) -> list[Record]: ...

    def __getitem__(self, index: int | slice) -> Record | list[Record]:
        if isinstance(index, slice):
            offsets = self._offsets[index]
            with self._open() as fh:
                return [self._read(fh, o) for o in offsets]
        offset = self._offsets[index]  # IndexError and negatives as an array's
        with self._open() as fh:
            return self._read(fh, offset)

    def __iter__(self) -> Iterator[Record]:
        with self._open() as fh:
            for offset in self._offsets:
                yield self._read(fh, offset)

    def __repr__(self) -> str:
        return f"StepRecords({self._shown!r}, step={self.step}, {len(self)} records)"

    def _open(self) -> BinaryIO:
        return open_regular(self._path, what="precguard records")

    def _read(self, fh: BinaryIO, offset: int) -> Record:
        fh.seek(offset)
        line = fh.readline(MAX_LINE_BYTES + 1)
        try:
            rec = Record.model_validate_json(line)
        except ValidationError:
            rec = None
        if rec is None or rec.step != self.step:
            raise DumpFormatError(
                f"{self._shown}: changed while it was read (the record at byte {offset} of "
                f"step {self.step} is no longer there)"
            )
        return rec


def _distinct(hashes: array) -> bool:
    """Whether no hash repeats (sorting a copy: 8 bytes each, once a step)."""
    ordered = np.sort(np.frombuffer(hashes, dtype=np.int64))
    return not bool(np.any(ordered[1:] == ordered[:-1]))
