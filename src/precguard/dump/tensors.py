"""Zero-copy, memory-mapped access to the tensors of a recording: the one tensor store.

Compare, replay and :meth:`Run.tensor <precguard.dump.reader.Run.tensor>` all
read saved tensors through :class:`TensorStore`.

``safe_open(...).get_tensor`` copies each tensor into fresh memory. Compare
reads every tensor of two recordings once, in chunks, so it maps the file
itself: the safetensors header (8-byte length, then JSON) says where each
tensor's bytes lie, and :func:`torch.frombuffer` views them without a copy.
Pages already compared are given back with ``madvise(MADV_DONTNEED)``
(the data stays in the page cache; only this process's mapping lets go), so
resident memory stays bounded by a few chunks, not by the size of a tensor
or of a recording.

The file is untrusted: the header is checked as strictly as the safetensors
library checks it (dtype, shape, offsets that tile the data exactly), the file
is found with the recording's path rules, and the tensor's dtype and shape
must be what its record says, before a single byte is viewed.
"""

from __future__ import annotations

import contextlib
import functools
import math
import mmap
import struct
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from pydantic_core import from_json

from precguard.dump.paths import rank_dir, rank_dir_name, rank_of, resolve_member
from precguard.dump.schema import Record
from precguard.dump.untrusted import check_size, file_size, open_regular
from precguard.errors import DumpFormatError
from precguard.text import shown

if TYPE_CHECKING:
    import torch

#: safetensors' dtype codes -> the names of torch's dtypes. Float4/6 codes pack several
#: values per byte, which a record's shape does not describe; they are refused by name.
_DTYPE_CODES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "C64": "complex64",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}


@functools.cache
def _dtypes() -> dict[str, torch.dtype]:
    """The codes of :data:`_DTYPE_CODES` this torch has (the unsigned ints need torch >= 2.3,
    float8 >= 2.1), with their dtypes.

    Built on first use: reading statistics records needs no torch, only a saved tensor does.
    """
    import torch

    found = {code: getattr(torch, name, None) for code, name in _DTYPE_CODES.items()}
    return {code: dtype for code, dtype in found.items() if dtype is not None}


_MAX_HEADER = 100 * 1024 * 1024
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)

#: ``release(first_element, end_element)``: the caller is done with those elements
Release = Callable[[int, int], None]


def tensor_path(root: Path, record: Record) -> Path:
    """The real path of ``record``'s tensor file, inside ``root/rank{R}/`` by the path rules."""
    if record.tensor is None:
        raise DumpFormatError(f"{shown(root)}: record {shown(record.key)} has no saved tensor")
    if rank_of(rank_dir_name(record.rank)) is None:
        raise DumpFormatError(f"{shown(root)}: record {shown(record.key)}: bad rank {record.rank}")
    return resolve_member(
        root,
        f"{rank_dir_name(record.rank)}/{record.tensor.file}",
        what=f"record {shown(record.key)}",
    )


def check_tensor_matches(record: Record, dtype: str, shape: Any, where: str) -> None:
    """Refuse a saved tensor whose dtype or shape is not what ``record`` says."""
    if dtype != record.dtype or list(shape) != list(record.shape):
        raise DumpFormatError(
            f"{where}: tensor of record {shown(record.key)} is {shown(dtype, 20)} "
            f"{shown(list(shape), 60)}, the record says {shown(record.dtype, 20)} "
            f"{shown(record.shape, 60)}"
        )


class _MappedFile:
    """One safetensors file, mapped read-only (copy-on-write, never written).

    The header is untrusted: it is validated as the safetensors library does
    before any byte is viewed (see :func:`_parse_header`).
    """

    def __init__(self, path: Path, shown_path: str) -> None:
        self.path = path
        self.shown_path = shown_path
        try:
            with open_regular(path, what="safetensors file") as fh:
                size = fh.seek(0, 2)
                fh.seek(0)
                self.data_start, self.entries = _parse_header(fh, size, shown_path)
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        except OSError as exc:
            raise DumpFormatError(f"{shown_path}: cannot read ({exc.strerror or exc})") from exc
        self.size = size

    def span(self, name: str) -> tuple[int, int]:
        """Absolute byte offsets ``(start, end)`` of tensor ``name`` in the file."""
        entry = self.entries.get(name)
        if entry is None:
            raise DumpFormatError(f"{self.shown_path}: has no tensor {shown(name, 80)}")
        _, _, start, end = entry
        return self.data_start + start, self.data_start + end

    def release(self, start: int, end: int) -> None:
        """Drop this process's pages covering bytes ``[start, end)``.

        Rounding outward is safe: the mapping is never written, so a dropped page
        that a neighbouring chunk still reads is simply read again from the file.
        """
        if _DONTNEED is None:
            return
        first = (start // mmap.PAGESIZE) * mmap.PAGESIZE
        last = min(-(-end // mmap.PAGESIZE) * mmap.PAGESIZE, self.size)
        if last > first:
            with contextlib.suppress(OSError, ValueError):
                self._map.madvise(_DONTNEED, first, last - first)

    def check(self, record: Record) -> _Entry:
        """``record``'s header entry, refused unless its dtype and shape are the record's."""
        assert record.tensor is not None
        name = record.tensor.name
        entry = self.entries.get(name)
        if entry is None:
            raise DumpFormatError(
                f"{self.shown_path}: has no tensor {shown(name, 80)} (record {shown(record.key)})"
            )
        check_tensor_matches(record, _DTYPE_CODES[entry[0]], entry[1], self.shown_path)
        return entry

    def tensor(self, record: Record) -> torch.Tensor:
        """A zero-copy view of ``record``'s tensor, once its dtype and shape are the record's."""
        import torch

        dtype_code, shape, start, _ = self.check(record)
        dtype = _dtypes()[dtype_code]
        numel = math.prod(shape)
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(self._map, dtype=dtype, count=numel, offset=self.data_start + start)
        return flat.view(shape)

    def close(self) -> None:
        # BufferError: a view still exists; the mapping goes when the last view does
        with contextlib.suppress(BufferError):
            self._map.close()


#: one validated header entry: dtype code, shape, start and end offset in the data
_Entry = tuple[str, list[int], int, int]


def _parse_header(fh: BinaryIO, size: int, where: str) -> tuple[int, dict[str, _Entry]]:
    """Read and validate a safetensors header; return the data start and the entries.

    The same rules as the safetensors library: an 8-byte little-endian length,
    a JSON object (nesting bounded), each tensor a known dtype, a shape of
    non-negative integers, and ``data_offsets`` that hold exactly
    ``numel * itemsize`` bytes; the tensors tile the data with no gap, overlap
    or byte past the end. Anything else is refused, never guessed at.
    """
    if size < 8:
        raise DumpFormatError(f"{where}: truncated safetensors file ({size} bytes)")
    (hlen,) = struct.unpack("<Q", fh.read(8))
    if hlen > _MAX_HEADER or 8 + hlen > size:
        raise DumpFormatError(
            f"{where}: truncated or corrupt safetensors file (its header length field "
            f"does not fit a file of {size} bytes)"
        )
    try:
        header = from_json(fh.read(hlen))
    except ValueError as exc:
        raise DumpFormatError(f"{where}: corrupt safetensors header ({shown(exc, 80)})") from exc
    if not isinstance(header, dict):
        raise DumpFormatError(f"{where}: corrupt safetensors header (not a JSON object)")
    entries: dict[str, _Entry] = {}
    for name, info in header.items():
        if name == "__metadata__":
            if info is not None and not (
                isinstance(info, dict) and all(isinstance(v, str) for v in info.values())
            ):
                raise DumpFormatError(f"{where}: corrupt safetensors header (__metadata__)")
            continue
        entries[name] = _entry(name, info, where)
    data_size = size - 8 - hlen
    end = 0
    for name, (_, _, start, stop) in sorted(entries.items(), key=lambda kv: kv[1][2:]):
        if start != end:
            raise DumpFormatError(
                f"{where}: corrupt safetensors header: tensor {shown(name, 80)} starts at byte "
                f"{start} of the data, expected {end} (overlapping or gapped tensors)"
            )
        end = stop
    if end != data_size:
        raise DumpFormatError(
            f"{where}: truncated or corrupt safetensors file: its tensors hold {end} bytes, "
            f"the file has {data_size} after the header"
        )
    return 8 + hlen, entries


def _entry(name: str, info: Any, where: str) -> _Entry:
    def bad(what: str) -> DumpFormatError:
        return DumpFormatError(
            f"{where}: corrupt safetensors header: tensor {shown(name, 80)}: {what}"
        )

    if not isinstance(info, dict):
        raise bad("not a JSON object")
    code = info.get("dtype")
    if not isinstance(code, str) or code not in _dtypes():
        raise bad(f"unsupported dtype {shown(repr(code), 20)}")
    shape = info.get("shape")
    if not isinstance(shape, list) or not all(_is_size(s) for s in shape):
        raise bad("shape is not a list of non-negative integers")
    offsets = info.get("data_offsets")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_size(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise bad("data_offsets is not [start, end] with 0 <= start <= end")
    start, stop = offsets
    if math.prod(shape) * _dtypes()[code].itemsize != stop - start:
        raise bad(f"shape {shown(shape, 60)} of {code} does not fill {stop - start} bytes")
    return code, shape, start, stop


def _is_size(x: Any) -> bool:
    return type(x) is int and x >= 0


class TensorStore:
    """Maps the safetensors files of one run on demand; a few stay open (LRU)."""

    def __init__(self, root: Path, *, keep_open: int = 8) -> None:
        self.root = root
        self._files: OrderedDict[Path, _MappedFile] = OrderedDict()
        self._paths: dict[tuple[int, str], Path] = {}
        self._keep = keep_open

    def releaser(self, record: Record, itemsize: int) -> Release:
        """A callback that gives back the pages of elements ``[a, b)`` of ``record``'s tensor.

        Call it only once nothing reads those elements any more.
        """
        mapped, name = self._mapped(record)
        base, _ = mapped.span(name)
        return lambda a, b: mapped.release(base + a * itemsize, base + b * itemsize)

    def tensor(self, record: Record) -> torch.Tensor:
        """Return a zero-copy view of the tensor saved for ``record``.

        Its file is found with the recording's path rules, and its dtype and
        shape must be the record's.
        """
        mapped, _ = self._mapped(record)
        return mapped.tensor(record)

    def validate(self, records: list[Record]) -> None:
        """Check every saved tensor of ``records`` against its record, whether read or not.

        A record whose file says another dtype or shape is an inconsistent
        recording, even where compare would judge the pair on statistics or
        shapes alone. Costs a header lookup per record (headers are parsed once).
        """
        for rec in records:
            if rec.tensor is not None:
                mapped, _ = self._mapped(rec)
                mapped.check(rec)

    def _mapped(self, record: Record) -> tuple[_MappedFile, str]:
        """The mapped file holding ``record``'s tensor (mapped now if need be), and its name."""
        if record.tensor is None:
            raise DumpFormatError(
                f"{shown(self.root)}: record {shown(record.key)} has no saved tensor"
            )
        ref = (record.rank, record.tensor.file)
        path = self._paths.get(ref)
        if path is None:  # resolve each file once: realpath costs a syscall per part
            path = self._paths[ref] = tensor_path(self.root, record)
        mapped = self._files.get(path)
        if mapped is None:
            where = shown(rank_dir(self.root, record.rank) / record.tensor.file)
            if not path.is_file():
                raise DumpFormatError(
                    f"{where}: missing (referenced by record {shown(record.key)})"
                )
            mapped = _MappedFile(path, where)
            self._files[path] = mapped
            while len(self._files) > self._keep:
                _, old = self._files.popitem(last=False)
                old.close()
        else:
            self._files.move_to_end(path)
        return mapped, record.tensor.name

    def close(self) -> None:
        """Unmap every file."""
        for mapped in self._files.values():
            mapped.close()
        self._files.clear()


def load_safetensors(path: Path, *, shown_path: str, limit: int) -> dict[str, torch.Tensor]:
    """Every tensor of a safetensors file outside a recording, each a tensor of its own.

    For files read whole (a saved generation run's prompt file): the file is
    opened only if regular (:func:`~precguard.dump.untrusted.open_regular`),
    refused unread when larger than ``limit`` bytes (its size from ``fstat``: a
    sparse 12 GiB file costs nothing to refuse), and its header validated as
    strictly as a recording's (offsets that tile the data exactly, so a file
    padded past its tensors is refused) before a byte of data is viewed.
    """
    import torch

    with open_regular(path, what="safetensors file") as fh:
        size = file_size(fh)
        check_size(shown_path, size, limit, what="safetensors file")
        data_start, entries = _parse_header(fh, size, shown_path)
        try:
            mapped = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        except (OSError, ValueError) as exc:
            raise DumpFormatError(f"{shown_path}: cannot map ({shown(exc, 80)})") from exc
    out: dict[str, torch.Tensor] = {}
    try:
        for name, (code, shape, start, _) in entries.items():
            dtype = _dtypes()[code]
            numel = math.prod(shape)
            if numel == 0:
                out[name] = torch.empty(shape, dtype=dtype)
                continue
            view = torch.frombuffer(mapped, dtype=dtype, count=numel, offset=data_start + start)
            out[name] = view.view(shape).clone()
            del view
    finally:
        with contextlib.suppress(BufferError):
            mapped.close()
    return out
