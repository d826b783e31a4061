"""Convert an msprobe dump into a precguard recording, through precguard's own writer.

The result is an ordinary recording (``manifest.json``, ``rank{R}/records.jsonl``,
safetensors files), so every precguard command reads it. Its manifest says where
it came from: ``device`` is ``msprobe`` (a dump does not say which device ran),
``options.source`` is ``msprobe`` with msprobe's task and level, and ``run_id``
is a digest of the dump's ``dump.json`` files, so two imports of one dump are
recognised as the same run by compare.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precguard._logging import get_logger
from precguard.dump.lock import release_writer_lock
from precguard.dump.reader import Run, load_run
from precguard.dump.untrusted import open_regular
from precguard.dump.writer import RunWriter, prepare_run_dir, remove_recording, write_json_atomic
from precguard.errors import DumpFormatError
from precguard.interop.msprobe.dump import Converted, read_rank_dump
from precguard.interop.msprobe.layout import RankDump, find_rank_dumps, is_msprobe_dump
from precguard.interop.msprobe.tensors import load_tensor
from precguard.text import shown

if TYPE_CHECKING:
    import torch

logger = get_logger(__name__)

#: bytes of tensor data gathered before a safetensors file is written
CHUNK_BYTES = 256 * 1024 * 1024


def import_msprobe(
    src: str | os.PathLike[str], out: str | os.PathLike[str], *, overwrite: bool = False
) -> Path:
    """Convert the msprobe dump at ``src`` into a precguard recording at ``out``.

    :param src: the dump path, one ``step{N}`` folder, or one rank folder.
    :param out: the recording to write; an existing non-empty directory is refused
        unless ``overwrite`` (and then only a precguard recording is replaced).
    :returns: ``out``.
    :raises DumpFormatError: ``src`` is no msprobe dump, or is malformed or unsafe
        (a tensor file that is not plain tensor data, a name leading outside it).

    >>> import_msprobe("msprobe_dump", "runs/npu")     # doctest: +SKIP
    PosixPath('runs/npu')
    """
    root = Path(src)
    dumps = find_rank_dumps(root)
    target = Path(out)
    if target.exists() and os.path.realpath(target) == os.path.realpath(root):
        raise DumpFormatError(f"{shown(target)}: is the msprobe dump itself; choose another --out")
    fresh = not target.exists() or (target.is_dir() and not any(target.iterdir()))
    dest = prepare_run_dir(target, overwrite=overwrite)
    try:
        _write(root, dumps, dest)
        _require_records(root, dest)
    except BaseException:
        # leave nothing half-written: what was there before is gone either way
        # (replaced with --overwrite), and a partial import is no recording
        if fresh:
            shutil.rmtree(dest, ignore_errors=True)
        else:
            with contextlib.suppress(Exception):
                remove_recording(dest)
        release_writer_lock(dest)
        raise
    return dest


def _require_records(root: Path, dest: Path) -> None:
    """Refuse, naming the dump, an import that produced no record at all."""
    from precguard.dump.paths import RECORDS_FILE, rank_of

    for entry in dest.iterdir():
        records = entry / RECORDS_FILE
        if rank_of(entry.name) is not None and records.is_file() and records.stat().st_size:
            return
    raise DumpFormatError(
        f"{shown(root)}: the msprobe dump holds no records (every dump.json's 'data' is "
        "empty); nothing to import"
    )


def open_recording(path: str | os.PathLike[str]) -> Run:
    """Open ``path`` as a recording: a precguard recording as is, an msprobe dump converted.

    An msprobe dump is converted into a temporary recording that is removed when
    the returned :class:`~precguard.dump.reader.Run` is garbage-collected (or the
    process exits). Its tensor files are copied, so a large tensor dump costs
    that much temporary disk; import it once with :func:`import_msprobe` to compare
    it repeatedly.
    """
    if not is_msprobe_dump(path):
        return load_run(path)
    # the name says where it came from: compare's messages name this directory
    label = "".join(c if c.isalnum() or c in "-_" else "_" for c in Path(path).resolve().name)
    tmp = Path(tempfile.mkdtemp(prefix=f"precguard-msprobe-{label[:40]}-"))
    try:
        _write(Path(path), find_rank_dumps(Path(path)), tmp)
        run = load_run(tmp)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    weakref.finalize(run, shutil.rmtree, tmp, ignore_errors=True)
    logger.info("msprobe_dump_converted", source=str(path), recording=str(tmp))
    return run


def _write(root: Path, dumps: list[RankDump], dest: Path) -> None:
    world = max(d.rank for d in dumps) + 1
    steps = max(d.step for d in dumps) + 1
    writers: dict[int, RunWriter] = {}
    seqs: dict[int, int] = {}
    meta: dict[str, Any] = {}
    has_tensors = False
    skipped: dict[str, int] = {}
    digest = hashlib.sha256()
    failure: BaseException | None = None
    try:
        # rank 0's writer writes the manifest: make it first
        for dump in sorted(dumps, key=lambda d: (d.rank != 0, d.rank, d.step)):
            _digest_file(digest, dump.member(root, "dump.json", what="msprobe dump"))
            converted = read_rank_dump(root, dump)
            meta = meta or converted.meta
            for family, n in converted.skipped.items():
                skipped[family] = skipped.get(family, 0) + n
            writer = writers.get(dump.rank)
            if writer is None:
                writer = writers[dump.rank] = RunWriter(
                    dest,
                    rank=dump.rank,
                    world_size=world,
                    device="msprobe",
                    options={},
                )
            seq = seqs.get(dump.rank, 0)
            for rec in converted.records:
                rec["seq"] = seq
                seq += 1
            seqs[dump.rank] = seq
            has_tensors |= _save_tensors(writer, converted, dump.step)
            writer.write_records(converted.records)
        if skipped:
            logger.warning("msprobe_entries_skipped", kinds=skipped)
        options = {
            "source": "msprobe",
            "msprobe_task": meta.get("task"),
            "msprobe_level": meta.get("level"),
            "tensors": has_tensors,
            "backward": True,
        }
        for writer in writers.values():
            writer.manifest = writer.manifest.model_copy(
                update={"options": options, "run_id": digest.hexdigest()[:32]}
            )
    except BaseException as exc:
        failure = exc
        raise
    finally:
        for writer in writers.values():
            writer.close(steps=steps, error=failure)
    if 0 not in writers:
        # only rank 0 writes the manifest; a dump of other ranks (one rank folder
        # given alone) keeps its rank numbers and still gets one
        first = writers[min(writers)]
        write_json_atomic(dest / "manifest.json", first.manifest.model_dump_json(indent=2))


def _digest_file(digest: Any, path: Path) -> None:
    try:
        with open_regular(path, what="msprobe dump file") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    except OSError as exc:
        raise DumpFormatError(f"{shown(path)}: cannot read ({exc.strerror or exc})") from exc


def _save_tensors(writer: RunWriter, converted: Converted, step: int) -> bool:
    """Load each record's tensor file and write them in safetensors chunks; set the refs."""
    if not converted.tensors:
        return False
    chunk: dict[str, torch.Tensor] = {}
    owners: list[int] = []
    size = 0
    names: set[str] = set()

    def flush() -> None:
        nonlocal chunk, owners, size
        if not chunk:
            return
        fname = writer.save_tensors(chunk, step)
        for i in owners:
            converted.records[i]["tensor"]["file"] = fname
        chunk, owners, size = {}, [], 0

    for i, tfile in converted.tensors.items():
        rec = converted.records[i]
        tensor = load_tensor(
            tfile.path, shown_path=tfile.shown_path, dtype=rec["dtype"], shape=rec["shape"]
        )
        name = rec["key"]
        if name in names:  # a key recorded twice in a step (accumulated gradients)
            name = f"{name}@{rec['seq']}"
        names.add(name)
        rec["tensor"] = {"file": "", "name": name}
        chunk[name] = tensor
        owners.append(i)
        size += tensor.numel() * tensor.element_size()
        if size >= CHUNK_BYTES:
            flush()
    flush()
    return True
