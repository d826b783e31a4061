"""Throughput and peak memory of ``precguard compare`` on two full-tensor recordings.

Writes two recordings of ``--gb`` GB of tensors each (golden, and golden plus
small noise) with precguard's own writer into a temporary directory, compares
them in a fresh process, and prints the throughput (tensor bytes of both
recordings per second of wall time) and that process's peak resident memory,
next to its resident memory right after start-up. The temporary directory is
removed afterwards. Goal: >= 1 GB/s on 2 cores, peak memory independent of
the recording size (try ``--gb 0.25`` and ``--gb 2``).

The files were just written, so they are read from the page cache: the figure
is compare's own speed, not the disk's. Compare runs on one thread unless
``PRECGUARD_COMPARE_THREADS`` says otherwise.

    .venv/bin/python benchmarks/compare.py [--gb 1.0] [--tensor-mb 64] [--dtype float32]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# VmHWM (peak resident set) from /proc: unlike ru_maxrss it is not inherited
# from the parent across fork/exec.
_CHILD = r"""
import json, sys, time
def hwm_kb():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
import precguard as pc
base = hwm_kb()
t = time.perf_counter()
result = pc.compare_runs(sys.argv[1], sys.argv[2])
elapsed = time.perf_counter() - t
print(json.dumps({"seconds": elapsed, "startup_kb": base, "peak_kb": hwm_kb(),
                  "verdict": result.verdict, "records": len(result.records)}))
"""


def _stats(t: torch.Tensor) -> dict[str, Any]:
    """The statistics a precguard recording holds for ``t``, computed as capture does."""
    from precguard.capture.stats import StatsBuffer

    buf = StatsBuffer()
    buf.add(t)
    return buf.materialize()[0]


def write_pair(root: Path, gb: float, tensor_mb: int, dtype: torch.dtype) -> int:
    """Write golden and actual recordings under ``root``; return bytes of tensors per run."""
    from precguard.dump.writer import RunWriter

    itemsize = torch.empty(0, dtype=dtype).element_size()
    numel = tensor_mb * 2**20 // itemsize
    count = max(1, math.ceil(gb * 1e9 / (numel * itemsize)))
    writers = {
        name: RunWriter(
            root / name, device="cpu", dtype=str(dtype).removeprefix("torch."), model="Benchmark"
        )
        for name in ("golden", "actual")
    }
    gen = torch.Generator().manual_seed(0)
    for i in range(count):
        golden = torch.randn(numel, generator=gen).to(dtype)
        noise = torch.randn(numel, generator=gen).mul_(1e-6)
        actual = (golden.float() * (1 + noise)).to(dtype)
        for name, t in (("golden", golden), ("actual", actual)):
            key = f"layers.{i}.0.forward.output.0"
            rec = {
                "key": key,
                "module": f"layers.{i}",
                "module_type": "Linear",
                "call": 0,
                "phase": "forward",
                "role": "output",
                "index": 0,
                "name": "output",
                "step": i,
                "rank": 0,
                "seq": i,
                "dtype": str(dtype).removeprefix("torch."),
                "shape": [numel],
                "stats": _stats(t),
            }
            file = writers[name].save_tensors({key: t}, step=i)
            writers[name].write_records([{**rec, "tensor": {"file": file, "name": key}}])
    for w in writers.values():
        w.close(steps=count)
    return count * numel * itemsize


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=1.0, help="tensor data per recording")
    parser.add_argument("--tensor-mb", type=int, default=64, help="size of each tensor")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="precguard-bench-", dir=args.dir))
    try:
        t0 = time.perf_counter()
        per_run = write_pair(root, args.gb, args.tensor_mb, getattr(torch, args.dtype))
        print(
            f"wrote 2 x {per_run / 1e9:.2f} GB ({args.dtype}) in "
            f"{time.perf_counter() - t0:.1f} s under {root}"
        )
        child = subprocess.run(
            [sys.executable, "-c", _CHILD, str(root / "golden"), str(root / "actual")],
            check=True,
            capture_output=True,
            text=True,
        )
        res = json.loads(child.stdout.strip().splitlines()[-1])
        threads = os.environ.get("PRECGUARD_COMPARE_THREADS", "1")
        seconds = res["seconds"]
        print(
            f"compared {res['records']} record pairs in {seconds:.2f} s "
            f"(verdict {res['verdict']}, {threads} compare thread(s))"
        )
        print(
            f"throughput: {2 * per_run / seconds / 1e9:.2f} GB/s read (both recordings), "
            f"{per_run / seconds / 1e9:.2f} GB/s per recording"
        )
        print(
            f"peak RSS: {res['peak_kb'] / 1024:.0f} MiB "
            f"(after start-up {res['startup_kb'] / 1024:.0f} MiB; "
            f"working set {(res['peak_kb'] - res['startup_kb']) / 1024:.0f} MiB)"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
