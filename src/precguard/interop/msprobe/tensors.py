"""Load the tensor files of an msprobe dump without running code from them.

msprobe saves tensors with ``torch.save`` (``.pt``, a pickle) or ``numpy.save``
(``.npy``). A pickle can run any code when loaded, so a ``.pt`` file is read
only with ``torch.load(..., weights_only=True)`` (torch's restricted unpickler:
tensors, containers and numbers, nothing else), a ``.npy`` file only with
``numpy.load(..., allow_pickle=False)`` (object arrays refused), and any other
suffix is refused. A file that does not load under those rules, or holds
something other than one tensor of the dtype and shape its record says, is a
:class:`~precguard.errors.DumpFormatError`.
"""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from precguard.dump.untrusted import check_size, file_size, memory_limit, open_regular
from precguard.errors import DumpFormatError
from precguard.text import shown

if TYPE_CHECKING:
    import torch

#: the suffixes msprobe writes and how each is read
SUFFIXES = (".pt", ".npy")


#: what a .pt archive may hold beyond its tensor's bytes (the pickled index, version, padding)
ARCHIVE_SLACK_BYTES = 1 << 20


def _expected_bytes(dtype: str, shape: list[int]) -> int:
    """The bytes a tensor of ``dtype`` and ``shape`` holds (dtype unknown: 8 per element)."""
    import torch

    found = getattr(torch, dtype, None)
    size = found.itemsize if isinstance(found, torch.dtype) else 8
    numel = 1
    for dim in shape:
        numel *= max(int(dim), 0)
    return numel * size


def _check_archive(path: Path, shown_path: str, expected: int) -> None:
    """Refuse a zip-format ``.pt`` whose entries would inflate past its tensor's size.

    torch writes its archives uncompressed; a DEFLATE entry is a file someone
    made, and ``torch.load`` would inflate it whole before any dtype or shape
    is checked (17 MB on disk became 4.2 GB in memory). The sizes are read
    from the zip's central directory, before anything is inflated.
    """
    if not zipfile.is_zipfile(path):
        return  # torch's legacy format: stored as is, bounded by the file's own size
    try:
        with zipfile.ZipFile(path) as archive:
            total = sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise DumpFormatError(
            f"{shown_path}: not a readable .pt archive ({shown(exc, 80)})"
        ) from exc
    if total > expected + ARCHIVE_SLACK_BYTES:
        raise DumpFormatError(
            f"{shown_path}: its archive holds {total} bytes uncompressed, its dump.json "
            f"record's tensor needs {expected}; refused before inflating it"
        )


def load_tensor(path: Path, *, shown_path: str, dtype: str, shape: list[int]) -> torch.Tensor:
    """Load one msprobe tensor file safely; it must hold one tensor of ``dtype`` and ``shape``.

    :param path: the real path (already confined to the dump directory).
    :param shown_path: how to name the file in an error.
    :param dtype: the torch dtype name its record gives (``float32``).
    :param shape: the shape its record gives.
    """
    import torch

    if not path.exists():
        raise DumpFormatError(f"{shown_path}: missing")
    # a regular file (a FIFO would hang the load), no larger than its record's tensor and
    # the format's own overhead, and never more than a quarter of the memory: checked
    # from fstat, before numpy or torch reads a byte (a sparse 12 GiB file costs nothing)
    with open_regular(path, what="msprobe tensor file") as fh:
        limit = min(_expected_bytes(dtype, shape) + ARCHIVE_SLACK_BYTES, memory_limit() // 4)
        check_size(shown_path, file_size(fh), limit, what="tensor file of its dump.json record")
    if path.suffix == ".pt":
        _check_archive(path, shown_path, _expected_bytes(dtype, shape))
        try:
            obj = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # the restricted unpickler refused it, or a corrupt file
            raise DumpFormatError(
                f"{shown_path}: does not load as plain tensor data (torch.load with "
                f"weights_only=True: {shown(exc, 120)}); refused"
            ) from exc
    elif path.suffix == ".npy":
        try:
            array = np.load(path, allow_pickle=False)
        except Exception as exc:
            raise DumpFormatError(
                f"{shown_path}: not a plain .npy array (numpy.load with allow_pickle=False: "
                f"{shown(exc, 120)}); refused"
            ) from exc
        if not isinstance(array, np.ndarray) or array.dtype.kind not in "biuf":
            raise DumpFormatError(f"{shown_path}: not a numeric array; refused")
        if not array.dtype.isnative:  # a big-endian .npy: torch reads native order only
            array = array.astype(array.dtype.newbyteorder("="))
        obj = torch.from_numpy(np.ascontiguousarray(array))
    else:
        raise DumpFormatError(
            f"{shown_path}: unsupported tensor file type {shown(path.suffix or '(none)', 20)}; "
            "only .pt (loaded with weights_only=True) and .npy (allow_pickle=False) are read"
        )
    if not isinstance(obj, torch.Tensor):
        raise DumpFormatError(f"{shown_path}: holds a {type(obj).__name__}, not a tensor; refused")
    got = str(obj.dtype).removeprefix("torch.")
    if got != dtype or list(obj.shape) != list(shape):
        raise DumpFormatError(
            f"{shown_path}: holds a {got} tensor of shape {list(obj.shape)}, its dump.json "
            f"record says {shown(dtype, 20)} {shown(shape, 60)}"
        )
    return obj.detach().contiguous()
