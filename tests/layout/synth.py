"""Write small recordings by hand: a column- then row-parallel pair, whole or 2-way split.

The whole model is ``y1 = x W1^T`` (module ``col``) then ``y2 = y1 W2^T``
(module ``row``). Split 2-way, rank r holds rows r of W1 (its output is the
r-th half of y1's features) and columns r of W2 (its output is a partial sum:
``y1_r W2_r^T``). Every record's statistics are those of its tensor.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import torch
from safetensors.torch import save_file

from precguard import Manifest, Record
from precguard.layout import tensor_stats

#: (module, phase, role, index, name, tensor)
Item = tuple[str, str, str, int, str, torch.Tensor]

TP_SPEC = """
name: synth
modules:
  - match: col
    kind: column
  - match: row
    kind: row
"""


def write_run(path: Path, ranks: dict[int, list[Item]], *, tensors: bool = True) -> Path:
    """A complete one-step recording of the items of each rank."""
    path.mkdir(parents=True)
    manifest = Manifest(
        precguard_version="test",
        torch_version=torch.__version__,
        device="cpu",
        dtype="float32",
        model="Net",
        world_size=len(ranks),
        created="2026-01-01T00:00:00+00:00",
        run_id=uuid.uuid4().hex,
        complete=True,
        steps=1,
    )
    (path / "manifest.json").write_text(manifest.model_dump_json())
    for rank, items in ranks.items():
        rdir = path / f"rank{rank}"
        rdir.mkdir()
        lines, saved = [], {}
        for seq, (module, phase, role, index, name, t) in enumerate(items):
            key = f"{module}.0.{phase}.{role}.{index}"
            rec = Record(
                key=key,
                module=module,
                module_type="Linear",
                call=0,
                phase=phase,
                role=role,
                index=index,
                name=name,
                step=0,
                rank=rank,
                seq=seq,
                dtype="float32",
                shape=list(t.shape),
                stats=tensor_stats(t),
                tensor={"file": "t.safetensors", "name": key} if tensors else None,
            )
            saved[key] = t.clone().contiguous()
            lines.append(rec.model_dump_json())
        (rdir / "records.jsonl").write_text("\n".join(lines) + "\n")
        if tensors:
            save_file(saved, str(rdir / "t.safetensors"))
    return path


def weights(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x [2, 3], W1 [4, 3], W2 [3, 4]."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for shape in ((2, 3), (4, 3), (3, 4)))  # type: ignore[return-value]


def whole(
    x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, col: str = "col", row: str = "row"
) -> list[Item]:
    """The records of the whole model (modules named ``col`` and ``row``)."""
    y1 = x @ w1.T
    return [
        (col, "forward", "input", 0, "args.0", x),
        (col, "forward", "param", 0, "weight", w1),
        (col, "forward", "output", 0, "output", y1),
        (row, "forward", "input", 0, "args.0", y1),
        (row, "forward", "param", 0, "weight", w2),
        (row, "forward", "output", 0, "output", y1 @ w2.T),
    ]


def split(
    x: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    rank: int,
    col: str = "col",
    row: str = "row",
    *,
    reduced: bool = False,
) -> list[Item]:
    """The records rank ``rank`` of 2 holds; ``reduced``: the row module all-reduces itself."""
    w1_r, w2_r = w1.chunk(2, 0)[rank], w2.chunk(2, 1)[rank]
    y1_r = x @ w1_r.T
    y2 = (x @ w1.T) @ w2.T if reduced else y1_r @ w2_r.T
    return [
        (col, "forward", "input", 0, "args.0", x),
        (col, "forward", "param", 0, "weight", w1_r),
        (col, "forward", "output", 0, "output", y1_r),
        (row, "forward", "input", 0, "args.0", y1_r),
        (row, "forward", "param", 0, "weight", w2_r),
        (row, "forward", "output", 0, "output", y2),
    ]
