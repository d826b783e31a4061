"""Every report the CLI writes appears whole or not at all: a temporary file, then a rename.

``--json``, ``--html``, ``--csv``, ``--junit-xml``, graph exports, plots and
saved runs' JSON are read by other programs (a CI step, a dashboard polling
the file, a second precguard). Written in place, a reader can see half a
document, and two writers can leave a file mixing both. :func:`atomic_output`
writes into a fresh temporary file in the same directory (so the rename never
crosses a file system), flushes it, then ``os.replace``-s it over the target:
a reader opens the old file or the new one, never a mix; a writer that fails
or is killed leaves the old file and removes its temporary one.

A link at the output's name is followed, as a plain ``open(path, "w")``
would (the user named it; ``report.html`` may link into a web folder): the
file it points at is replaced atomically and the link stays. An output that
is not a regular file (``/dev/stdout``, a pipe, a FIFO) is a stream, written
to directly: there is nothing to replace there. The new file gets the mode a
plain ``open(path, "w")`` would give it (an existing file's mode is kept).
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

from precguard.errors import PrecguardError, UsageError
from precguard.text import shown


def _mode_for(path: Path) -> int:
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_output(
    path: str | os.PathLike[str],
    *,
    binary: bool = False,
    what: str = "output",
    error: type[PrecguardError] = UsageError,
) -> Iterator[IO]:
    """A file object whose content replaces ``path`` when the block ends without an error.

    :param path: the file to (re)place.
    :param binary: write bytes instead of UTF-8 text (text keeps ``\\n`` as written).
    :param what: the option or file it is, for the error (``"--json"``).
    :param error: what a write that fails (a full disk, a read-only folder) raises.

    >>> with atomic_output("report.json", what="--json") as fh:   # doctest: +SKIP
    ...     fh.write("{}")
    """
    try:
        st = os.stat(path)  # through links, /dev/stdout's included
    except OSError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
        # /dev/stdout, a pipe, a FIFO: a stream, not a file to replace
        try:
            fh = open(path, "wb") if binary else open(path, "w", encoding="utf-8", newline="")  # noqa: SIM115
        except OSError as exc:
            raise error(f"{what} {shown(path)}: cannot write ({exc.strerror or exc})") from exc
        with fh:
            yield fh
        return
    target = Path(os.path.realpath(path))  # follow the user's link: the link stays
    folder = target.parent
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name[:100]}.", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise error(f"{what} {shown(path)}: cannot write ({exc.strerror or exc})") from exc
    try:
        try:
            os.fchmod(fd, _mode_for(target))
            fh = os.fdopen(fd, "wb") if binary else os.fdopen(fd, "w", encoding="utf-8", newline="")
        except BaseException:
            os.close(fd)
            raise
        with fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise error(f"{what} {shown(path)}: cannot write ({exc.strerror or exc})") from exc
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_atomic(
    path: str | os.PathLike[str],
    data: str | bytes,
    *,
    what: str = "output",
    error: type[PrecguardError] = UsageError,
) -> Path:
    """Replace ``path`` with ``data`` (text as UTF-8) atomically; see :func:`atomic_output`."""
    with atomic_output(path, binary=isinstance(data, bytes), what=what, error=error) as fh:
        fh.write(data)
    return Path(path)


__all__ = ["atomic_output", "write_atomic"]
