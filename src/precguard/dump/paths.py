"""Where the files of a recording may be: one resolver for every name read from it.

A recording is untrusted input (it travels between teams, into bug reports and
CI), so every file name that comes from inside it (a record's ``tensor.file``,
a rank folder, ``records.jsonl``, ``manifest.json``) goes through
:func:`resolve_member` before it is opened. A name is accepted only when it is
relative, has no ``..`` or empty part, and resolves, after following any
symbolic link, to a path inside the recording directory. Anything else is a
:class:`~precguard.errors.DumpFormatError` naming what referred to it.

The recording directory itself is named by the user and may be a link; what is
inside it may not lead out of it.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from precguard.errors import DumpFormatError
from precguard.text import shown

#: a rank folder: ``rank`` and the rank in ASCII digits, without leading zeros
RANK_DIR = re.compile(r"rank(0|[1-9][0-9]{0,8})", re.ASCII)

#: the records file of each rank folder
RECORDS_FILE = "records.jsonl"
#: each rank's own account of how it ended (dump.schema.RankStatus)
STATUS_FILE = "status.json"
#: the run's manifest, at the top of the recording
MANIFEST_FILE = "manifest.json"

#: longest name accepted for one path component (most file systems allow 255 bytes)
MAX_COMPONENT_BYTES = 255


def rank_dir_name(rank: int) -> str:
    """The folder of ``rank``'s part of a recording, relative to the run: ``rank3``.

    The one place the name is spelled; :func:`rank_of` reads it back.
    """
    return f"rank{rank}"


def rank_dir(run: str | os.PathLike[str], rank: int) -> Path:
    """``RUN/rank{R}``: where ``rank`` writes its records, tensors and vendor state."""
    return Path(run) / rank_dir_name(rank)


def rank_of(name: str) -> int | None:
    """The rank a folder name stands for (``rank3`` -> 3), or None if it is no rank folder.

    Only ``rank`` followed by ASCII digits counts: ``rank²`` or ``rank03`` do not.
    """
    m = RANK_DIR.fullmatch(name)
    return int(m.group(1)) if m else None


def resolve_member(root: Path, name: str, *, what: str) -> Path:
    """Return the real path of ``name`` (relative to ``root``) if it lies inside ``root``.

    :param root: the recording directory (or a rank folder inside it).
    :param name: the relative name as found in the recording (``/`` separated).
    :param what: who refers to it, for the error (``"record model.0.forward.output.0"``).
    :raises DumpFormatError: the name is absolute, climbs out with ``..``, is too long,
        holds a NUL, or a symbolic link on the way leads outside ``root``.

    The file need not exist; the caller reports a missing one.

    >>> resolve_member(Path("runs/golden/rank0"), "tensors-000000-0000.safetensors",
    ...                what="record x")                          # doctest: +SKIP
    PosixPath('/abs/runs/golden/rank0/tensors-000000-0000.safetensors')
    """
    problem = _name_problem(name)
    if problem is not None:
        raise DumpFormatError(f"{shown(root)}: {what}: file name {shown(name, 80)} {problem}")
    base = Path(os.path.realpath(root))
    real = Path(os.path.realpath(base / name))
    if real != base and base not in real.parents:
        raise DumpFormatError(
            f"{shown(root)}: {what}: {shown(name, 80)} leads outside the recording "
            "(a symbolic link); refused"
        )
    return real


def _name_problem(name: str) -> str | None:
    if not isinstance(name, str) or not name:
        return "is empty"
    if "\x00" in name or "\\" in name:
        return "holds a NUL or a backslash"
    if name.startswith("/") or os.path.isabs(name):
        return "is absolute; only names inside the recording are read"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return "is not a plain relative name (empty, '.' or '..' part)"
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            return f"is longer than {MAX_COMPONENT_BYTES} bytes"
    return None
