"""The one door every file precguard reads comes through: bounded, regular, confined, validated.

Recordings, saved generation runs, watch directories, graph files, layout
specs, msprobe dumps and goldens are written by someone else and travel
(bug reports, CI artifacts, another team's machine). Each reader goes through
the functions here instead of keeping its own checks, so one set of limits
holds everywhere and a broken or hostile file is refused with one line
(a :class:`~precguard.errors.DumpFormatError`, exit code 2), never a
traceback, a hang or a gigabyte of memory:

* **regular files only**: :func:`open_regular` opens with ``O_NONBLOCK`` (a
  FIFO's ``open`` would otherwise wait for a writer forever) and refuses
  anything whose ``fstat`` is not a regular file (a FIFO, a device, a
  directory) before a byte is read;
* **sizes bounded before reading**: a whole document is read only when its
  size (from ``fstat``, so a sparse 12 GiB file costs nothing) is within the
  format's limit; JSONL is read a line at a time with a bounded line length;
* **nesting bounded**: pydantic-core's parser refuses nesting deeper than its
  recursion limit (a few hundred levels) with an error instead of a
  ``RecursionError``;
* **numbers in range**: :data:`Int64` and :data:`Finite` are the schema types
  for a number a format holds: an integer outside a signed 64-bit range (which
  torch and the ``struct`` module cannot hold) or a float that overflowed to
  infinity is refused by validation, as is a dict or a string where a number
  belongs (strict validation, no coercion);
* **confined paths**: :func:`confine` resolves a name found inside a
  directory, links included, and refuses one that leads out of it;
* **one-line refusals**: :func:`validated` turns a pydantic error into
  ``file: field 'a.b': message`` with every quoted value made printable
  (:func:`~precguard.text.shown`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, BinaryIO, TypeVar

from pydantic import BaseModel, Field, ValidationError
from pydantic_core import from_json

from precguard.errors import DumpFormatError, PrecguardError
from precguard.text import shown

#: a JSON integer a format holds: torch, numpy and ``struct`` hold signed 64-bit integers,
#: so a larger one (10**30 as a token id or a seed) is refused when validated, not when used
Int64 = Annotated[int, Field(ge=-(2**63), le=2**63 - 1)]
#: a non-negative count or index, in the same range
Count = Annotated[int, Field(ge=0, le=2**63 - 1)]
#: a finite float: JSON ``1e999`` parses to infinity, which no format writes where it means
#: a number (a non-finite statistic is written as the string "NaN"/"Infinity")
Finite = Annotated[float, Field(allow_inf_nan=False)]

#: a JSONL line longer than this is not one precguard wrote (records, watch rows, alerts are
#: short: names, shapes and a few numbers; a layer row holds two floats per layer, ~50 bytes
#: each, so 1 MiB is ten thousand layers)
MAX_LINE_BYTES = 1024 * 1024
#: a JSON document precguard writes (a manifest, watch.json, generation.json) is kilobytes
#: to a few megabytes (a manifest lists the modules; generation.json the prompts' token ids)
MAX_DOCUMENT_BYTES = 16 * 1024 * 1024

M = TypeVar("M", bound=BaseModel)


def open_regular(
    path: str | os.PathLike[str], *, what: str, error: type[PrecguardError] = DumpFormatError
) -> BinaryIO:
    """Open ``path`` for reading if, and only if, it is a regular file.

    ``O_NONBLOCK`` makes ``open`` of a FIFO return at once instead of waiting for
    a writer; ``fstat`` on the open descriptor (no race with a swap after a
    ``stat``) then refuses it, like a device or a directory. The flag is cleared
    again for the regular file, whose reads never block anyway.

    :raises error: not a regular file, or unreadable (the message names ``what``).
    """
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise error(f"{shown(path)}: cannot read {what} ({exc.strerror or exc})") from exc
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = (
                "a FIFO"
                if stat.S_ISFIFO(mode)
                else "a directory"
                if stat.S_ISDIR(mode)
                else (
                    "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "not a regular file"
                )
            )
            raise error(f"{shown(path)}: {kind}; a {what} is a regular file")
        with contextlib.suppress(OSError, AttributeError):
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_size(fh: BinaryIO) -> int:
    """The size of an open file, from ``fstat`` (nothing is read)."""
    return os.fstat(fh.fileno()).st_size


def check_size(
    path: str | os.PathLike[str],
    size: int,
    limit: int,
    *,
    what: str,
    error: type[PrecguardError] = DumpFormatError,
) -> None:
    """Refuse a file of ``size`` bytes larger than ``limit``, before anything is read."""
    if size > limit:
        raise error(
            f"{shown(path)}: {size} bytes, larger than the {limit} a {what} may hold here; "
            "refused unread"
        )


def read_bytes(
    path: str | os.PathLike[str],
    *,
    limit: int,
    what: str,
    error: type[PrecguardError] = DumpFormatError,
) -> bytes:
    """The whole of a regular file of at most ``limit`` bytes."""
    with open_regular(path, what=what, error=error) as fh:
        check_size(path, file_size(fh), limit, what=what, error=error)
        try:
            data = fh.read(limit + 1)
        except OSError as exc:
            raise error(f"{shown(path)}: cannot read ({exc.strerror or exc})") from exc
    # the file may have grown since fstat: the bound holds on what was read
    check_size(path, len(data), limit, what=what, error=error)
    return data


def parse_json(
    data: bytes | str, *, where: str, error: type[PrecguardError] = DumpFormatError
) -> Any:
    """Parse one JSON document, nesting bounded by pydantic-core (no ``RecursionError``).

    ``NaN`` and ``Infinity`` are accepted as JSON (precguard writes them for a
    non-finite statistic); the schema decides where they may stand.
    """
    try:
        return from_json(data)
    except ValueError as exc:
        raise error(f"{where}: not valid JSON ({shown(exc, 80)})") from exc


def read_json_file(
    path: str | os.PathLike[str],
    *,
    limit: int = MAX_DOCUMENT_BYTES,
    what: str,
    error: type[PrecguardError] = DumpFormatError,
) -> Any:
    """Parse the JSON document in the regular file ``path``: at most ``limit`` bytes.

    pydantic-core's parser refuses deep nesting with an error instead of
    exhausting the stack, and reads invalid UTF-8 as an error too.
    """
    data = read_bytes(path, limit=limit, what=what, error=error)
    return parse_json(data, where=shown(path), error=error)


def iter_json_lines(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_line: int = MAX_LINE_BYTES,
    max_bytes: int | None = None,
    error: type[PrecguardError] = DumpFormatError,
) -> Iterator[tuple[int, bytes | None]]:
    """Each line of a JSONL file with its number, read a line at a time (memory: one line).

    Yields ``(lineno, line)`` for every non-blank line; a last line without its
    newline (a write cut short by a kill) is yielded as ``(lineno, None)`` so the
    caller can skip it with a warning. A line longer than ``max_line`` is
    refused before it is kept (a sparse file with no newline is one such line);
    with ``max_bytes``, a file larger than that is refused before its first line
    (for a reader that keeps every line).
    """
    for lineno, _offset, line in iter_json_lines_at(
        path, what=what, max_line=max_line, max_bytes=max_bytes, error=error
    ):
        yield lineno, line


def iter_json_lines_at(
    path: str | os.PathLike[str],
    *,
    what: str,
    max_line: int = MAX_LINE_BYTES,
    max_bytes: int | None = None,
    error: type[PrecguardError] = DumpFormatError,
) -> Iterator[tuple[int, int, bytes | None]]:
    """:func:`iter_json_lines` with where each line starts: ``(lineno, byte offset, line)``,
    so a reader can keep the offset (8 bytes) and read the line again when it needs it."""
    shown_path = shown(path)
    with open_regular(path, what=what, error=error) as fh:
        if max_bytes is not None:
            check_size(path, file_size(fh), max_bytes, what=f"file of {what}s", error=error)
        lineno = 0
        offset = 0
        while True:
            try:
                line = fh.readline(max_line + 1)
            except OSError as exc:
                raise error(f"{shown_path}: cannot read ({exc.strerror or exc})") from exc
            if not line:
                return
            lineno += 1
            if len(line) > max_line:
                raise error(
                    f"{shown_path} line {lineno}: longer than {max_line} bytes; not a {what}"
                )
            if not line.endswith(b"\n"):
                yield lineno, offset, None
                return
            if line.strip():
                yield lineno, offset, line
            offset += len(line)


def first_error(exc: ValidationError) -> str:
    """``field 'a.b': message`` for the first error of ``exc``, safe to print."""
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"field '{shown(loc, 60)}': {shown(err['msg'], 120)}"


def validated(
    model: type[M],
    raw: Any,
    *,
    where: str,
    error: type[PrecguardError] = DumpFormatError,
    strict: bool = True,
) -> M:
    """``model`` validated from parsed JSON, or one line naming the first bad field.

    Strict by default: a string or a float where an integer belongs, or a
    number where a string does, is refused rather than coerced.
    """
    if not isinstance(raw, dict):
        raise error(f"{where}: expected a JSON object")
    try:
        return model.model_validate(raw, strict=strict)
    except ValidationError as exc:
        raise error(f"{where}: {first_error(exc)}") from exc


def confine(
    root: str | os.PathLike[str],
    name: str,
    *,
    what: str,
    inside: str = "the recording",
    error: type[PrecguardError] = DumpFormatError,
) -> Path:
    """The real path of ``name`` (relative to ``root``) if it lies inside ``root``.

    :param root: the directory the user named (it may itself be a link).
    :param name: the relative name as found in the files (``/`` separated).
    :param what: who refers to it, for the error (``"record model.0.forward.output.0"``).
    :param inside: what ``root`` is, for the error.
    :raises error: the name is empty, absolute, climbs out with ``..``, is too long,
        holds a NUL or a backslash, or a symbolic link on the way leads outside ``root``.

    The file need not exist; the caller reports a missing one.
    """
    problem = _name_problem(name)
    if problem is not None:
        raise error(f"{shown(root)}: {what}: file name {shown(name, 80)} {problem}")
    base = Path(os.path.realpath(root))
    real = Path(os.path.realpath(base / name))
    if real != base and base not in real.parents:
        raise error(
            f"{shown(root)}: {what}: {shown(name, 80)} leads outside {inside} "
            "(a symbolic link); refused"
        )
    return real


#: longest name accepted for one path component (most file systems allow 255 bytes)
MAX_COMPONENT_BYTES = 255


def _name_problem(name: str) -> str | None:
    if not isinstance(name, str) or not name:
        return "is empty"
    if "\x00" in name or "\\" in name:
        return "holds a NUL or a backslash"
    if name.startswith("/") or os.path.isabs(name):
        return "is absolute; only names inside the directory are read"
    for part in name.split("/"):
        if part in ("", ".", ".."):
            return "is not a plain relative name (empty, '.' or '..' part)"
        if len(part.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            return f"is longer than {MAX_COMPONENT_BYTES} bytes"
    return None


def physical_memory() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def memory_limit() -> int:
    """The memory this process may use: physical memory, or the address-space limit if lower.

    Readers that must hold a whole file (a saved run's logits, a watch's rows)
    refuse one that cannot fit a share of this before reading it, instead of
    failing with ``MemoryError`` halfway (or being killed).
    """
    import resource

    limits = [physical_memory() or 1 << 62]
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft != resource.RLIM_INFINITY and soft > 0:
        limits.append(soft)
    return min(limits)


__all__ = [
    "MAX_DOCUMENT_BYTES",
    "MAX_LINE_BYTES",
    "Count",
    "Finite",
    "Int64",
    "check_size",
    "confine",
    "file_size",
    "first_error",
    "iter_json_lines",
    "iter_json_lines_at",
    "memory_limit",
    "open_regular",
    "parse_json",
    "physical_memory",
    "read_bytes",
    "read_json_file",
    "validated",
]
