"""Golden recordings: a recording normalised so that the same numbers give the same bytes.

A golden is an ordinary precguard recording (``precguard compare GOLDEN RUN``
reads it as is), kept in git beside the test that checks against it. What a
fresh recording holds that is not a number of the model is normalised when
it becomes a golden:

- ``manifest.json``: ``created`` (a timestamp) is emptied, and ``run_id`` (random
  per recording) becomes a digest of the golden's own content, so the same
  numbers give the same id, and a changed golden a new one;
- ``rank{R}/status.json``: the host name and process id are emptied;
- every file is written with ``\\n`` line endings, in UTF-8, on every OS.

What stays is what a reviewer of a refresh should see change: the records
(one JSON line each, so ``git diff`` shows which records moved), full tensors
where they were asked for, and the manifest's versions, device, dtype,
capture options and environment fingerprint.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Literal

from precguard._logging import get_logger
from precguard.dump.paths import MANIFEST_FILE, STATUS_FILE, rank_of
from precguard.dump.schema import Manifest, RankStatus
from precguard.dump.untrusted import (
    confine,
    memory_limit,
    parse_json,
    read_bytes,
    read_json_file,
    validated,
)
from precguard.dump.writer import remove_recording
from precguard.errors import DumpFormatError, UsageError
from precguard.text import shown

logger = get_logger(__name__)

#: what writing a golden did: first written, replaced with different bytes, or left as it was
GoldenAction = Literal["new", "refreshed", "unchanged"]

#: prefix of a golden's run_id (the rest is a digest of its content)
RUN_ID_PREFIX = "golden-"


def golden_files(recording: str | os.PathLike[str]) -> dict[str, bytes]:
    """The files of the golden made from ``recording``: relative POSIX path -> bytes.

    ``recording`` is a finished precguard recording directory. Rank folders
    contribute their regular files (records, status, tensors, vendor state);
    sub-folders (saved inputs of a NaN origin) and temporary files are left out.
    """
    root = Path(recording)
    manifest = _manifest(root)
    files: dict[str, bytes] = {}
    ranks = sorted(
        (r, p) for p in root.iterdir() if p.is_dir() and (r := rank_of(p.name)) is not None
    )
    for _rank, folder in ranks:
        for entry in sorted(folder.iterdir(), key=lambda p: p.name):
            if not entry.is_file() or entry.name.endswith(".tmp"):
                continue
            name = f"{folder.name}/{entry.name}"
            data = _read_member(root, name)
            if entry.name == STATUS_FILE:
                where = shown(root / name)
                status = validated(RankStatus, parse_json(data, where=where), where=where)
                files[name] = _json_bytes(status.model_copy(update={"host": "", "pid": None}))
            else:
                files[name] = data
    digest = hashlib.sha256()
    body = manifest.model_copy(update={"created": "", "run_id": ""})
    for name, data in [(MANIFEST_FILE, _json_bytes(body)), *sorted(files.items())]:
        digest.update(name.encode() + b"\0" + data + b"\0")
    run_id = RUN_ID_PREFIX + digest.hexdigest()[:32]
    files[MANIFEST_FILE] = _json_bytes(body.model_copy(update={"run_id": run_id}))
    return files


def read_golden(golden: str | os.PathLike[str]) -> dict[str, bytes]:
    """The files of the golden at ``golden`` as they are on disk (the same paths as
    :func:`golden_files`); empty when there is none."""
    root = Path(golden)
    if not (root / MANIFEST_FILE).is_file():
        return {}
    files = {MANIFEST_FILE: _read_member(root, MANIFEST_FILE)}
    for folder in sorted(root.iterdir(), key=lambda p: p.name):
        if folder.is_dir() and rank_of(folder.name) is not None:
            for entry in sorted(folder.iterdir(), key=lambda p: p.name):
                if entry.is_file() and not entry.name.endswith(".tmp"):
                    files[f"{folder.name}/{entry.name}"] = _read_member(
                        root, f"{folder.name}/{entry.name}"
                    )
    return files


def _read_member(root: Path, name: str) -> bytes:
    """One file of a recording or golden, read whole through :mod:`precguard.dump.untrusted`.

    Inside ``root`` after resolving links, a regular file, and at most a quarter
    of the memory this process may use (a golden's files are held at once to be
    compared byte for byte; a larger one cannot be, and is refused unread).
    """
    path = confine(root, name, what=name, inside="the golden or recording")
    return read_bytes(path, limit=memory_limit() // 4, what="recording file")


def write_golden(recording: str | os.PathLike[str], golden: str | os.PathLike[str]) -> GoldenAction:
    """Write ``recording`` as the golden at ``golden``; return what that did.

    ``"unchanged"`` when the golden already holds exactly these bytes (nothing
    is touched, so a refresh that changed nothing shows no diff); ``"refreshed"``
    when an older golden was replaced, ``"new"`` when there was none. Only a
    precguard recording is ever replaced, and of it only its own parts (see
    :func:`precguard.dump.writer.remove_recording`): a folder that is not one
    is refused with nothing touched.
    """
    out = Path(golden)
    files = golden_files(recording)
    if out.exists() and not out.is_dir():
        raise UsageError(f"golden {shown(out)}: exists and is not a directory")
    action: GoldenAction = "new"
    if out.is_dir() and any(out.iterdir()):
        if read_golden(out) == files:
            logger.info("golden_unchanged", path=str(out))
            return "unchanged"
        remove_recording(out)
        action = "refreshed"
    out.mkdir(parents=True, exist_ok=True)
    # the manifest last: a golden interrupted half-way has no manifest and is no recording
    for name in sorted(files, key=lambda n: n == MANIFEST_FILE):
        path = out / name
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(files[name])
        os.replace(tmp, path)
    logger.info("golden_written", path=str(out), action=action, files=len(files))
    return action


def _manifest(root: Path) -> Manifest:
    path = confine(root, MANIFEST_FILE, what="manifest", inside="the recording")
    where = shown(root / MANIFEST_FILE)
    if not path.is_file():
        raise DumpFormatError(f"{where}: missing; not a precguard recording")
    raw = read_json_file(path, what="precguard manifest")
    return validated(Manifest, raw, where=where)


def _json_bytes(model: Manifest | RankStatus) -> bytes:
    """``model`` as indented JSON with a final newline: the same bytes on every OS."""
    return (model.model_dump_json(indent=2) + "\n").encode()
