"""``RUN/rank{R}/vendor.jsonl``: the device state a backend keeps after each recorded step.

Some numerics leave no trace in the tensors: in Ascend's saturation mode an
overflow becomes ±max, and only a status register says it happened. A
backend reports such state through :meth:`~precguard.backend.Backend.vendor_state`;
this module writes it next to the records, one JSON object per step.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from precguard._logging import get_logger
from precguard.dump.paths import rank_dir

if TYPE_CHECKING:
    from precguard.backend import Backend

logger = get_logger(__name__)

VENDOR_FILE = "vendor.jsonl"


def record_vendor_state(
    backend: Backend, run_dir: str | os.PathLike[str], step: int, *, rank: int = 0
) -> dict[str, Any] | None:
    """Ask ``backend`` for its state after ``step`` and append it to ``rank{R}/vendor.jsonl``.

    Returns the line written (``{"step", "device", "state"}``), or None when the
    backend has nothing to keep. A ``vendor_state`` that raises is logged and
    written as ``{"step", "device", "error"}``: the recording goes on, and the
    failure stays in it as evidence.
    """
    folder = rank_dir(run_dir, rank)
    line: dict[str, Any] = {"step": step, "device": backend.device}
    try:
        state = backend.vendor_state(step, folder / "vendor" / backend.device_type)
    except Exception as exc:
        line["error"] = f"{type(backend).__name__}.vendor_state raised {type(exc).__name__}: {exc}"
        logger.error("vendor_state_failed", device=backend.device, step=step, cause=line["error"])
    else:
        if state is None:
            return None
        line["state"] = state
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / VENDOR_FILE, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(line, default=str) + "\n")
    return line
