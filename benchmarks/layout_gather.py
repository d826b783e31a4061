"""Cost of ``compare --layout``: gathering a 2-way tensor-parallel recording, then comparing.

Writes a synthetic whole recording and its 2-way split (``--layers`` pairs of a
column- then row-parallel linear, hidden size ``--hidden``, one step), then
times ``compare(golden, whole copy)`` (no gathering) against
``compare(golden, split, layout=...)``, with statistics only and with full
tensors, and prints the peak RSS growth of each.

    .venv/bin/python benchmarks/layout_gather.py [--layers 32 --hidden 1024 --tokens 64]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
import uuid
from pathlib import Path

import torch
from safetensors.torch import save_file

import precguard
from precguard.dump.schema import Manifest, Record
from precguard.layout import LayoutSpec
from precguard.layout.combine import tensor_stats

SPEC = LayoutSpec.model_validate(
    {"modules": [{"match": "*.col", "kind": "column"}, {"match": "*.row", "kind": "row"}]}
)


def _write(
    path: Path, ranks: dict[int, list[tuple[str, str, int, torch.Tensor]]], save: bool
) -> None:
    path.mkdir(parents=True)
    manifest = Manifest(
        precguard_version="bench", torch_version=torch.__version__, device="cpu",
        dtype="float32", model="Net", world_size=len(ranks), run_id=uuid.uuid4().hex,
        created="2026-01-01T00:00:00+00:00", complete=True, steps=1,
    )  # fmt: skip
    (path / "manifest.json").write_text(manifest.model_dump_json())
    for rank, items in ranks.items():
        rdir = path / f"rank{rank}"
        rdir.mkdir()
        lines, tensors = [], {}
        for seq, (module, role, index, t) in enumerate(items):
            key = f"{module}.0.forward.{role}.{index}"
            rec = Record(
                key=key, module=module, module_type="Linear", call=0, phase="forward",
                role=role, index=index, name="weight" if role == "param" else "args.0", step=0,
                rank=rank, seq=seq, dtype="float32", shape=list(t.shape), stats=tensor_stats(t),
                tensor={"file": "t.safetensors", "name": key} if save else None,
            )  # fmt: skip
            lines.append(rec.model_dump_json())
            tensors[key] = t.clone()
        (rdir / "records.jsonl").write_text("\n".join(lines) + "\n")
        if save:
            save_file(tensors, str(rdir / "t.safetensors"))


def _model(layers: int, hidden: int, tokens: int, parts: int) -> dict[int, list]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(tokens, hidden, generator=g)
    ranks: dict[int, list] = {r: [] for r in range(parts)}
    for i in range(layers):
        w1 = torch.randn(4 * hidden, hidden, generator=g) / hidden**0.5
        w2 = torch.randn(hidden, 4 * hidden, generator=g) / (4 * hidden) ** 0.5
        for r in range(parts):
            w1_r, w2_r = w1.chunk(parts, 0)[r], w2.chunk(parts, 1)[r]
            y1_r = x @ w1_r.T
            ranks[r] += [
                (f"l.{i}.col", "input", 0, x), (f"l.{i}.col", "param", 0, w1_r),
                (f"l.{i}.col", "output", 0, y1_r), (f"l.{i}.row", "input", 0, y1_r),
                (f"l.{i}.row", "param", 0, w2_r), (f"l.{i}.row", "output", 0, y1_r @ w2_r.T),
            ]  # fmt: skip
        x = torch.tanh((x @ w1.T) @ w2.T)
    return ranks


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for save in (False, True):
            label = "full tensors" if save else "statistics only"
            whole = _model(args.layers, args.hidden, args.tokens, 1)
            _write(root / f"golden{save}", whole, save)
            _write(root / f"copy{save}", whole, save)
            _write(root / f"split{save}", _model(args.layers, args.hidden, args.tokens, 2), save)
            del whole
            rows = []
            for name, actual, layout in (
                ("whole vs whole", "copy", None),
                ("--layout, 2-way", "split", SPEC),
            ):
                before = _peak_mb()
                start = time.perf_counter()
                result = precguard.compare_runs(
                    root / f"golden{save}", root / f"{actual}{save}", layout=layout
                )
                rows.append((name, time.perf_counter() - start, _peak_mb() - before, result))
            print(
                f"{label}: {args.layers} layers x 6 records, hidden {args.hidden}, "
                f"{args.tokens} tokens"
            )
            for name, secs, grew, result in rows:
                print(
                    f"  {name:16s} {secs:7.2f} s   peak RSS +{grew:6.0f} MB   {result.verdict}, "
                    f"{result.counts.passed} pass, {result.counts.missing} not compared"
                )


if __name__ == "__main__":
    main()
