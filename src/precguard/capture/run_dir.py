"""One decision on the output directory for every rank of a distributed run.

Rank 0 alone checks and prepares the run directory (the other ranks' folders
would otherwise make it "non-empty" to rank 0). Its verdict (ready, or the
error it refused with) is broadcast to every rank before anyone proceeds, so
all ranks go on together or all raise the same error with the same line:
none is left waiting at a barrier for a rank 0 that gave up, also when only
rank 0 can see the problem (a directory on rank 0's node only).

The verdict travels as a JSON string through ``broadcast_object_list``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from precguard.dump.writer import prepare_run_dir
from precguard.errors import OutputExistsError, PrecguardError, UsageError

#: the errors rank 0 may refuse with, by name, so every rank raises the same class
_ERRORS: dict[str, type[PrecguardError]] = {
    cls.__name__: cls for cls in (OutputExistsError, UsageError, PrecguardError)
}


def agree_on_run_dir(
    out: str | os.PathLike[str], *, overwrite: bool, rank: int, world_size: int
) -> Path:
    """Prepare ``out`` on rank 0 and make every rank reach rank 0's decision.

    :raises OutputExistsError: on every rank when rank 0 refused a non-empty directory.
    :raises UsageError: on every rank when rank 0 could not use the directory.
    """
    if world_size <= 1:
        return prepare_run_dir(out, overwrite=overwrite)
    verdict: dict[str, str] = {"ok": "yes"}
    failure: BaseException | None = None
    if rank == 0:
        try:
            prepare_run_dir(out, overwrite=overwrite)
        except PrecguardError as exc:
            verdict = {"ok": "no", "error": type(exc).__name__, "message": str(exc)}
            failure = exc
        except BaseException as exc:  # tell the others before giving up ourselves
            verdict = {"ok": "no", "error": "PrecguardError", "message": _unexpected(out, exc)}
            failure = exc
    box = [json.dumps(verdict)]
    torch.distributed.broadcast_object_list(box, src=0)
    got = json.loads(box[0])
    if got.get("ok") == "yes":
        return Path(out)
    if failure is not None:
        raise failure
    raise _ERRORS.get(got.get("error", ""), PrecguardError)(got.get("message", "refused"))


def _unexpected(out: str | os.PathLike[str], exc: BaseException) -> str:
    return f"{out}: rank 0 could not prepare the recording ({type(exc).__name__}: {exc})"
