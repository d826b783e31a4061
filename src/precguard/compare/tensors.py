"""Zero-copy, memory-mapped access to the tensors of a recording.

``safe_open(...).get_tensor`` copies each tensor into fresh memory. Compare
reads every tensor of two recordings once, in chunks, so it maps the file
itself: the safetensors header (8-byte length, then JSON) says where each
tensor's bytes lie, and :func:`torch.frombuffer` views them without a copy.
Only the pages being compared are resident, so peak memory does not grow
with the size of a recording or of a tensor.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import struct
from collections import OrderedDict
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

    def tensor(self, record: Record) -> torch.Tensor:
        """Return a zero-copy view of the tensor saved for ``record``."""
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
        return mapped.tensor(record.tensor.name)

    def close(self) -> None:
        """Unmap every file."""
        for mapped in self._files.values():
            mapped.close()
        self._files.clear()
