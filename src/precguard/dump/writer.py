"""Write a recording directory: manifest, JSONL records, safetensors files.

A run killed at any moment stays readable up to its last flushed step: the
manifest is replaced atomically, a safetensors file is written under a
temporary name and renamed before any record that points to it is written,
and records are appended one line each and flushed per step.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import shutil
import socket
import tempfile
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson
from pydantic import TypeAdapter, ValidationError
from pydantic_core import to_json
from safetensors import SafetensorError

from precguard._logging import get_logger
from precguard.dump.lock import hold_writer_lock, holds_writer_lock, release_writer_lock
from precguard.dump.paths import RECORDS_FILE, STATUS_FILE, rank_dir
from precguard.dump.schema import SCHEMA_VERSION, Manifest, RankStatus, Record, RunError
from precguard.errors import DumpFormatError, OutputExistsError, UsageError
from precguard.text import shown

if TYPE_CHECKING:
    import torch

logger = get_logger(__name__)


#: validates one flushed batch of records in a single call (pydantic-core, no per-record
#: Python work); the hooks only queue plain dicts
_RECORDS: TypeAdapter[list[Record]] = TypeAdapter(list[Record])


def record_json(fields: dict[str, Any]) -> bytes:
    """One record's line of records.jsonl: its JSON as the :class:`Record` model writes it.

    pydantic-core's encoding (a model instance per record would cost ~5 us more):
    non-finite floats as ``"NaN"``, ``"Infinity"``, ``"-Infinity"``, floats in their
    shortest round-trip form, fields not given left out (readers default them).
    orjson writes the same bytes for every other value a record holds (the same
    shortest floats, the same string escapes: tests/dump/test_format_owner.py) in
    a third of the time (0.9 against 2.6 us for a record with evidence; 1.2 us with
    the check below), but a non-finite float as ``null``; a record's floats are its
    statistics, so a record whose statistics are not plainly finite
    (:func:`_finite_stats`) is encoded by pydantic-core, as is anything orjson refuses
    (an integer beyond 64 bits).
    """
    stats = fields.get("stats")
    if stats is None or _finite_stats(stats):
        try:
            return orjson.dumps(fields)
        except TypeError:  # orjson.JSONEncodeError is one
            pass
    return to_json(fields, inf_nan_mode="strings")


def _finite_stats(stats: dict[str, Any]) -> bool:
    """Whether every float of a record's ``stats`` is finite (and it has no fp8 part).

    One sum, as it is asked for every record: finite floats whose sum overflows only
    send their record to the slower encoder, and a missing field or a None does too.
    """
    try:
        total = stats["min"] + stats["max"] + stats["mean"] + stats["std"] + stats["l2"]
        return "fp8" not in stats and math.isfinite(total + stats["absmax"])
    except (KeyError, TypeError):
        return False


def prepare_run_dir(path: str | os.PathLike[str], *, overwrite: bool = False) -> Path:
    """Create ``path`` for a new recording and return it.

    An existing non-empty directory is refused unless ``overwrite``, and even
    then only a precguard recording is replaced (see :func:`remove_recording`):
    a directory that is not one is refused with nothing touched.
    """
    out = Path(path)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{shown(out)}: exists and is not a directory")
    if out.is_dir():
        hold_writer_lock(out)  # before anything is looked at or removed
    try:
        _prepare_locked(out, overwrite=overwrite)
    except BaseException:
        release_writer_lock(out)
        raise
    return out


def _prepare_locked(out: Path, *, overwrite: bool) -> None:
    """The body of :func:`prepare_run_dir`, run holding ``out``'s writer lock (once it exists)."""
    if out.is_dir() and any(out.iterdir()):
        if not overwrite:
            raise OutputExistsError(
                f"{shown(out)}: directory exists and is not empty (pass --overwrite / "
                "overwrite=True to replace a recording)"
            )
        remove_recording(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{shown(out)}: cannot write here ({exc.strerror or exc})") from exc
    if not holds_writer_lock(out):
        hold_writer_lock(out)  # a new directory: a writer racing for it is refused here
    try:
        # a fresh, randomly named file: a planted link cannot redirect the probe
        fd, probe = tempfile.mkstemp(prefix=".precguard-write-test-", dir=out)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise UsageError(f"{shown(out)}: cannot write here ({exc.strerror or exc})") from exc


def remove_recording(out: Path) -> None:
    """Remove the parts of the precguard recording in ``out``, and nothing else.

    ``out`` must hold a ``manifest.json`` that is a regular file and a valid
    precguard manifest; its parts are that manifest (and a left-over
    ``manifest.json.tmp``) and the rank folders (``rank<digits>``, real
    directories). A rank folder that is a symbolic link, or a directory that is
    not a recording, is refused before anything is removed. Other files (notes,
    ``fingerprints.json``) stay.
    """
    from precguard.dump.paths import rank_of
    from precguard.dump.reader import MAX_MANIFEST_BYTES, read_json_file

    refuse = f"{shown(out)}: refusing to overwrite"
    manifest = out / "manifest.json"
    if not manifest.is_file() or manifest.is_symlink():
        raise OutputExistsError(
            f"{refuse} a directory that is not a precguard recording (no manifest.json); "
            "choose another --out or empty it yourself"
        )
    try:
        raw = read_json_file(manifest, limit=MAX_MANIFEST_BYTES, what="precguard manifest")
        version = raw.get("schema_version") if isinstance(raw, dict) else None
        if type(version) is not int or version < 1:  # a newer precguard's recording is one too
            raise DumpFormatError("no integer schema_version")
        Manifest.model_validate(raw)
    except (DumpFormatError, ValidationError) as exc:
        raise OutputExistsError(
            f"{refuse} it: its manifest.json is not a precguard manifest; choose another "
            "--out or empty it yourself"
        ) from exc
    doomed: list[Path] = [manifest]
    for entry in sorted(out.iterdir()):
        if entry.name == "manifest.json.tmp":
            doomed.append(entry)
        elif rank_of(entry.name) is not None:
            if entry.is_symlink() or not entry.is_dir():
                raise OutputExistsError(
                    f"{refuse} it: {shown(entry.name)} is a symbolic link or not a directory"
                )
            doomed.append(entry)
    try:
        for entry in doomed:
            if entry.is_dir():
                shutil.rmtree(entry)  # never follows links inside it
            else:
                entry.unlink()
    except OSError as exc:
        raise UsageError(f"{shown(out)}: cannot remove the old recording ({exc})") from exc
    logger.info("recording_replaced", path=str(out), removed=[e.name for e in doomed])


def write_json_atomic(path: Path, data: str) -> None:
    """Replace ``path`` with ``data`` so that readers see the old or the new file, never half."""
    tmp = path.with_name(path.name + ".tmp")
    # Never write through a link planted under the temporary name (or the final
    # one: os.replace swaps the link itself, not what it points at).
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _as_os_error(exc: Exception, path: Path) -> OSError:
    """The OSError behind a safetensors write error ("I/O error: ... (os error 28)")."""
    found = re.search(r"os error (\d+)", str(exc))
    if found is None:
        return OSError(f"{path}: {exc}")
    code = int(found.group(1))
    return OSError(code, os.strerror(code), str(path))


def write_json_or_in_place(path: Path, data: str) -> None:
    """:func:`write_json_atomic`, or, where no new file can be made, rewrite ``path`` in place.

    A directory made read-only (or a full disk) refuses the temporary file, but
    the manifest itself may still be writable: its owner's last word
    (``complete: false`` and the error) is worth the small risk of a torn file
    that only a kill during this write could leave.
    """
    try:
        write_json_atomic(path, data)
    except OSError:
        if path.is_symlink() or not path.is_file():
            raise
        with contextlib.suppress(OSError):
            os.unlink(path.with_name(path.name + ".tmp"))
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(data)


def _torch_version() -> str:
    """The version of the torch a recording is made with (imported here, not by every reader
    of this module: compare writes its reports without torch)."""
    import torch

    return torch.__version__


class RunWriter:
    """Writes one rank's part of a recording.

    Rank 0 (or a single process) also writes the manifest.
    """

    def __init__(
        self,
        root: Path,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str = "cpu",
        dtype: str | None = None,
        model: str | None = None,
        target: str | None = None,
        options: dict[str, Any] | None = None,
        fingerprint: dict[str, Any] | None = None,
    ) -> None:
        from precguard import __version__

        self.root = root
        self.rank = rank
        self.rank_dir = rank_dir(root, rank)
        self.rank_dir.mkdir(parents=True, exist_ok=True)
        self.manifest = Manifest(
            schema_version=SCHEMA_VERSION,
            precguard_version=__version__,
            torch_version=_torch_version(),
            device=device,
            dtype=dtype,
            model=model,
            target=target,
            options=options or {},
            fingerprint=fingerprint or {},
            world_size=world_size,
            created=datetime.now(timezone.utc).isoformat(timespec="seconds"),
            run_id=uuid.uuid4().hex,
        )
        if rank == 0:
            self._write_manifest()
        self._write_status(RankStatus(rank=rank, host=socket.gethostname(), pid=os.getpid()))
        # unbuffered: each flushed batch is one write, undone whole if it fails
        self._records = open(self.rank_dir / RECORDS_FILE, "ab", buffering=0)  # noqa: SIM115
        self._chunk = 0
        #: record layouts (field names, stats or not) a ``trusted`` batch had validated
        self._layouts: set[tuple[tuple[str, ...], bool]] = set()

    def _write_manifest(self) -> None:
        write_json_or_in_place(self.root / "manifest.json", self.manifest.model_dump_json(indent=2))

    def _write_status(self, status: RankStatus) -> None:
        """Replace this rank's ``status.json`` (its own account of whether it completed)."""
        self._status = status
        write_json_or_in_place(self.rank_dir / STATUS_FILE, status.model_dump_json(indent=2))

    def update_manifest(self, **fields: Any) -> None:
        """Change manifest fields (e.g. ``model``, ``dtype``) and rewrite it (rank 0)."""
        self.manifest = self.manifest.model_copy(update=fields)
        if self.rank == 0:
            self._write_manifest()

    def save_tensors(self, tensors: dict[str, torch.Tensor], step: int) -> str:
        """Write ``tensors`` (name → CPU tensor) to a new safetensors file; return its name.

        The file appears under its final name only once complete, so a record
        pointing at it never points at half a file.
        """
        name = f"tensors-{step:06d}-{self._chunk:04d}.safetensors"
        self._chunk += 1
        tmp = self.rank_dir / (name + ".tmp")
        from safetensors.torch import save_file  # what saves a tensor has torch

        try:
            try:
                save_file(tensors, str(tmp))
            except SafetensorError as exc:  # safetensors' Rust side reports I/O errors so
                raise _as_os_error(exc, tmp) from exc
            os.replace(tmp, self.rank_dir / name)
        except BaseException:
            # a half-written file on a full disk holds the space the manifest needs
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
        return name

    def write_records(self, records: list[dict[str, Any]], *, trusted: bool = False) -> None:
        """Validate ``records`` as :class:`Record` s, append them as JSON lines, flush to the OS.

        The whole batch is validated at once, before anything is written: a
        record the format does not allow is a precguard bug, and raises
        ValueError naming it rather than leaving a line no reader accepts. The
        lines are the model's own JSON (:func:`record_json`). This runs at the end
        of every monitored forward: validation costs ~7 us per record
        (``benchmarks/record_write.py``).

        ``trusted``: the records were built by capture's own code, which fixes each
        field's type by construction (:meth:`precguard.capture.recording.Recording.add`),
        so only the first record of each layout (its field names, and whether it has
        statistics) is validated per writer: a layout the format does not allow still
        raises at once, and a steady run validates nothing (~1 ms of a hidden-256
        forward). The lines written are the same either way.
        """
        if not records:
            return
        check = records
        new: dict[tuple[tuple[str, ...], bool], None] = {}
        if trusted:
            layouts = self._layouts
            check = []
            for rec in records:
                layout = (tuple(rec), rec.get("stats") is None)
                if layout not in layouts and layout not in new:
                    new[layout] = None
                    check.append(rec)
        try:
            if check:
                _RECORDS.validate_python(check)
        except ValidationError as exc:
            err = exc.errors()[0]
            index = err["loc"][0] if err["loc"] else 0
            key = check[index].get("key") if isinstance(index, int) else None
            raise ValueError(
                f"{self.rank_dir / RECORDS_FILE}: refusing to write record {key!r}: "
                f"{'.'.join(str(p) for p in err['loc'][1:])}: {err['msg']}"
            ) from exc
        self._layouts.update(new)  # only once they passed
        # (a list, not a generator: a generator is one Python frame resumed per record)
        lines = b"\n".join([record_json(rec) for rec in records])
        self._append(lines + b"\n")

    def _append(self, data: bytes) -> None:
        """Append ``data`` to records.jsonl whole, or not at all (the file is cut back).

        A write that fails half-way (a full disk) would leave a truncated line
        that readers refuse; cutting the file back to its last whole batch keeps
        every step written before the failure readable.
        """
        fh = self._records
        start = fh.seek(0, os.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                view = view[fh.write(view) or 0 :]
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fh.fileno(), start)
            raise

    def close(
        self,
        *,
        steps: int | None = None,
        error: BaseException | None = None,
        steps_run: int | None = None,
    ) -> None:
        """Flush and close the records; mark the manifest complete (rank 0).

        With ``error`` (the exception the run's body raised, or the I/O error
        that stopped the recording) the manifest says ``complete: false`` and
        names it: what was recorded is kept, but it is not the whole run.
        ``steps_run``: the steps the run went through, when more than ``steps``
        were recorded (the recording stopped early).
        """
        if self._records.closed:
            return
        self._records.close()
        try:
            self._mark_closed(steps=steps, error=error, steps_run=steps_run)
        finally:
            if self.rank == 0:
                release_writer_lock(self.root)

    def _mark_closed(
        self, *, steps: int | None, error: BaseException | None, steps_run: int | None
    ) -> None:
        ended: dict[str, Any] = {"steps": steps}
        if steps_run is not None:
            ended["steps_run"] = steps_run
        if error is None:
            self._write_status(self._status.model_copy(update={"complete": True, **ended}))
            self.update_manifest(complete=True, **ended)
        else:
            failure = RunError(type=type(error).__name__, message=str(error)[:500])
            self._write_status(self._status.model_copy(update={"error": failure, **ended}))
            self.update_manifest(complete=False, error=failure, **ended)
