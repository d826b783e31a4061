"""Where the files of a recording may be: one resolver for every name read from it.

A recording is untrusted input (it travels between teams, into bug reports and
CI), so every file name that comes from inside it (a record's ``tensor.file``,
a rank folder, ``records.jsonl``, ``manifest.json``) goes through
:func:`resolve_member` (:func:`precguard.dump.untrusted.confine`, the rule every
untrusted directory's names follow) before it is opened. A name is accepted only when it is
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

from precguard.dump.untrusted import MAX_COMPONENT_BYTES, confine

__all__ = [
    "MANIFEST_FILE",
    "MAX_COMPONENT_BYTES",
    "RECORDS_FILE",
    "STATUS_FILE",
    "rank_dir",
    "rank_dir_name",
    "rank_of",
    "resolve_member",
]

#: a rank folder: ``rank`` and the rank in ASCII digits, without leading zeros
RANK_DIR = re.compile(r"rank(0|[1-9][0-9]{0,8})", re.ASCII)

#: the records file of each rank folder
RECORDS_FILE = "records.jsonl"
#: each rank's own account of how it ended (dump.schema.RankStatus)
STATUS_FILE = "status.json"
#: the run's manifest, at the top of the recording
MANIFEST_FILE = "manifest.json"


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
    return confine(root, name, what=what)
