"""One writer per recording directory.

The process that prepares a recording directory holds an exclusive,
non-blocking ``flock`` on the directory itself until its writer closes. A
second writer (another process, or a second recording opened in this one)
finds the lock held and is refused before it looks at, let alone removes,
anything in the directory, with or without ``overwrite``. The lock is the
kernel's: it goes with the process that held it, so a killed run leaves no
stale lock and no lock file behind.

Where the filesystem cannot lock (some network filesystems answer ``ENOLCK``
or ``EINVAL``), the recording proceeds unlocked with a warning. A process
that forks while recording (a DataLoader's workers) shares the lock with its
children until they exit.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

from precguard._logging import get_logger
from precguard.errors import OutputExistsError
from precguard.text import shown

try:
    import fcntl
except ImportError:  # Windows: no flock; recordings there are not locked
    fcntl = None  # type: ignore[assignment]

logger = get_logger(__name__)

#: directory (resolved) -> the open descriptor holding its lock, in this process
_HELD: dict[str, int] = {}


def _key(path: Path) -> str:
    return str(path.resolve())


def hold_writer_lock(path: Path, *, what: str = "recording") -> None:
    """Take ``path``'s writer lock for this process, or refuse.

    ``what`` names the directory's kind in the refusal ("recording", "watch").

    :raises OutputExistsError: another writer (in this process or another one)
        holds it: a recording (or watch) is in progress there.
    """
    key = _key(path)
    if key in _HELD:
        raise OutputExistsError(
            f"{shown(path)}: a {what} is already being written there by this process; "
            "nothing was changed; close it first or choose another --out"
        )
    if fcntl is None:
        return
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return  # not there yet or unreadable: preparing the directory says why
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise OutputExistsError(
                f"{shown(path)}: another process is writing a {what} there (its lock is "
                "held); nothing was changed; wait for it to finish or choose another --out"
            ) from exc
        logger.warning("recording_not_locked", path=str(path), error=str(exc))
        return
    _HELD[key] = fd


def holds_writer_lock(path: Path) -> bool:
    """Whether this process holds ``path``'s writer lock."""
    return _key(path) in _HELD


def release_writer_lock(path: Path) -> None:
    """Let go of ``path``'s writer lock, if this process holds it. Idempotent."""
    fd = _HELD.pop(_key(path), None)
    if fd is not None:
        os.close(fd)  # closing the last descriptor releases the flock
