"""Zero-copy, memory-mapped access to the tensors of a recording.

``safe_open(...).get_tensor`` copies each tensor into fresh memory. Compare
reads every tensor of two recordings once, in chunks, so it maps the file
itself: the safetensors header (8-byte length, then JSON) says where each
tensor's bytes lie, and :func:`torch.frombuffer` views them without a copy.
Pages already compared are given back with ``madvise(MADV_DONTNEED)``
(the data stays in the page cache; only this process's mapping lets go), so
resident memory stays bounded by a few chunks, not by the size of a tensor
or of a recording.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import struct
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from precguard.dump.schema import Record
from precguard.errors import DumpFormatError

_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_MAX_HEADER = 100 * 1024 * 1024
_DONTNEED = getattr(mmap, "MADV_DONTNEED", None)

#: ``release(first_element, end_element)``: the caller is done with those elements
Release = Callable[[int, int], None]


class _MappedFile:
    """One safetensors file, mapped read-only (copy-on-write, never written)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            with open(path, "rb") as fh:
                size = fh.seek(0, 2)
                if size < 8:
                    raise DumpFormatError(f"{path}: truncated safetensors file ({size} bytes)")
                fh.seek(0)
                (hlen,) = struct.unpack("<Q", fh.read(8))
                if hlen > _MAX_HEADER or 8 + hlen > size:
                    raise DumpFormatError(
                        f"{path}: truncated or corrupt safetensors file (header of {hlen} "
                        f"bytes, file of {size})"
                    )
                header = json.loads(fh.read(hlen))
                self._map = mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_COPY)
        except OSError as exc:
            raise DumpFormatError(f"{path}: cannot read ({exc.strerror or exc})") from exc
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DumpFormatError(f"{path}: corrupt safetensors header ({exc})") from exc
        if not isinstance(header, dict):
            raise DumpFormatError(f"{path}: corrupt safetensors header (not a JSON object)")
        self.size = size
        self.data_start = 8 + hlen
        self.header: dict[str, Any] = header

    def span(self, name: str) -> tuple[int, int]:
        """Absolute byte offsets ``(start, end)`` of tensor ``name`` in the file."""
        start, end = self.header[name]["data_offsets"]
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

    def tensor(self, name: str) -> torch.Tensor:
        info = self.header.get(name)
        if not isinstance(info, dict):
            raise DumpFormatError(f"{self.path}: has no tensor named {name!r}")
        dtype = _DTYPES.get(str(info.get("dtype")))
        if dtype is None:
            raise DumpFormatError(f"{self.path}: tensor {name!r} has unsupported dtype")
        start, end = info["data_offsets"]
        shape = list(info["shape"])
        if self.data_start + end > self.size:
            raise DumpFormatError(
                f"{self.path}: truncated: tensor {name!r} needs bytes up to "
                f"{self.data_start + end}, the file has {self.size}"
            )
        numel = 1
        for s in shape:
            numel *= s
        if numel == 0:
            return torch.empty(shape, dtype=dtype)
        flat = torch.frombuffer(self._map, dtype=dtype, count=numel, offset=self.data_start + start)
        return flat.view(shape)

    def close(self) -> None:
        # BufferError: a view still exists; the mapping goes when the last view does
        with contextlib.suppress(BufferError):
            self._map.close()


class TensorStore:
    """Maps the safetensors files of one run on demand; a few stay open (LRU)."""

    def __init__(self, root: Path, *, keep_open: int = 8) -> None:
        self.root = root
        self._files: OrderedDict[Path, _MappedFile] = OrderedDict()
        self._keep = keep_open

    def releaser(self, record: Record, itemsize: int) -> Release:
        """A callback that gives back the pages of elements ``[a, b)`` of ``record``'s tensor.

        Call it only once nothing reads those elements any more.
        """
        mapped, name = self._mapped(record)
        base, _ = mapped.span(name)
        return lambda a, b: mapped.release(base + a * itemsize, base + b * itemsize)

    def tensor(self, record: Record) -> torch.Tensor:
        """Return a zero-copy view of the tensor saved for ``record``."""
        mapped, name = self._mapped(record)
        return mapped.tensor(name)

    def _mapped(self, record: Record) -> tuple[_MappedFile, str]:
        """The mapped file holding ``record``'s tensor (mapped now if need be), and its name."""
        if record.tensor is None:
            raise DumpFormatError(f"{self.root}: record {record.key} has no saved tensor")
        path = self.root / f"rank{record.rank}" / record.tensor.file
        mapped = self._files.get(path)
        if mapped is None:
            if not path.is_file():
                raise DumpFormatError(f"{path}: missing (referenced by record {record.key})")
            mapped = _MappedFile(path)
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
