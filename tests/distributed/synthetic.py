"""Hand-written multi-rank recordings (precguard's own writer) for fast replica tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from precguard.capture.stats import StatsBuffer
from precguard.dump.writer import RunWriter, prepare_run_dir


def stats_of(t: torch.Tensor) -> dict[str, Any]:
    """The statistics a recording holds for ``t``, computed as capture does."""
    buf = StatsBuffer()
    buf.add(t)
    return buf.materialize()[0]


def write_ranks(
    path: Path, per_rank: dict[int, list[tuple[str, str, torch.Tensor, dict[str, Any]]]],
    *, save: bool = False, steps: int = 1,
) -> Path:  # fmt: skip
    """Write one recording: rank -> [(module, role, tensor, extra fields)] for step 0.

    ``save`` also stores each tensor in full. Keys are ``module.0.forward.role.i``.
    """
    prepare_run_dir(path)
    world = max(per_rank) + 1
    for rank, items in per_rank.items():
        writer = RunWriter(path, rank=rank, world_size=world, model="Synthetic")
        counts: dict[tuple[str, str], int] = {}
        records, tensors = [], {}
        for seq, (module, role, t, extra) in enumerate(items):
            index = counts.get((module, role), 0)
            counts[(module, role)] = index + 1
            key = f"{module}.0.forward.{role}.{index}"
            rec = {"key": key, "module": module, "module_type": "Linear", "call": 0,
                   "phase": "forward", "role": role, "index": index, "step": 0, "rank": rank,
                   "seq": seq, "dtype": str(t.dtype).removeprefix("torch."),
                   "shape": list(t.shape), "stats": stats_of(t), **extra}  # fmt: skip
            if save:
                tensors[key] = t.contiguous()
            records.append(rec)
        if save:
            file = writer.save_tensors(tensors, 0)
            for rec in records:
                rec["tensor"] = {"file": file, "name": rec["key"]}
        writer.write_records(records)
        writer.close(steps=steps)
    return path


def collective(op: str, group: list[int], reduce_op: str | None = "sum") -> dict[str, Any]:
    """The ``collective`` field of a dist.<op> record."""
    return {"collective": {"op": op, "api": "c10d", "group": group, "reduce_op": reduce_op}}
