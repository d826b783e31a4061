"""Compare memory and time against the number of records: peak RSS per record pair.

Writes, for each ``--records`` count, a one-rank golden and actual recording of
statistics records (each module call records its input and its output, as
capture does; ``--per-step`` records per step, so the count grows by steps as
a longer run does), the actual being the golden with float32-sized noise. Then
compares each pair in a fresh process (``precguard.compare_runs``, one
worker) and prints the wall time, the peak resident memory (VmHWM), the peak
above the process's size before the comparison, and that growth per record
pair; the last column is time per pair, which stays flat when compare is
linear. The records are written straight as JSON lines (the writer's
validation would take longer than the comparison).

    .venv/bin/python benchmarks/compare_memory.py --records 20000 200000 [--per-step 10000]

``--per-step`` at least ``--records`` puts every record in one step (issue 41: one
big step). Before and after compare streamed a step (docs/compare.md, "One big
step"), on the shared 2-core machine (load average 11 and 18):

    .venv/bin/python benchmarks/compare_memory.py --records 200000 --per-step 2000000

    one step of 200,000 records: 245.8 s, peak 2,859 MiB, 13,741 B/pair (before)
                                 369.8 s, peak 1,017 MiB,  4,081 B/pair (after)
    one step of 500,000 records: 847.5 s, peak 2,165 MiB,  4,042 B/pair (after)

Before and after the one pass kept compact rows instead of a model per pair (load
average 2-3):

    .venv/bin/python benchmarks/compare_memory.py --records 20000 60000 --per-step 2000000

    one step of 20,000 records:  5.4 s, peak 305 MiB, 3,518 B/pair (before)
                                 6.7 s, peak 257 MiB, 1,033 B/pair (after)
    one step of 60,000 records: 15.9 s, peak 441 MiB, 3,547 B/pair (before)
                                20.3 s, peak 296 MiB, 1,017 B/pair (after)
    one step of 200,000 records: 85.6 s, peak 415 MiB,   936 B/pair (after, --records 200000)

Before and after a step's calls and the judge's maxima were held in arrays by module
number (main e34f6c6 and after, minutes apart on the shared 2-core machine):

    .venv/bin/python benchmarks/compare_memory.py --records 20000 60000 --per-step 2000000

    one step of 20,000 records:   6.3 s, peak 315 MiB, 1,039 B/pair (before)
                                  6.1 s, peak 309 MiB,   731 B/pair (after)
    one step of 60,000 records:  19.2 s, peak 354 MiB, 1,031 B/pair (before)
                                 18.4 s, peak 330 MiB,   607 B/pair (after)
    one step of 200,000 records: 63.3 s, peak 474 MiB,   935 B/pair (before, --records 200000)
                                 61.3 s, peak 387 MiB,   479 B/pair (after)
    one step of 2,000,000 records: 650.6 s, peak 1,169 MiB, 458 B/pair (after, --records 2000000)

2,000,000 records in one step peak at 1.23 GB: issue 41's 1.5 GB is met (~27 GiB
projected at first, ~1.9 GB before this change; docs/compare.md, "One big step").
Then compare of statistics stopped importing torch (~295 -> ~62 MiB before the first
record), run alone:

    .venv/bin/python benchmarks/compare_memory.py --records 20000 200000 2000000 --per-step 2000000

    one step of 20,000 records:      6.2 s, peak  76 MiB, 733 B/pair
    one step of 200,000 records:    67.1 s, peak 154 MiB, 482 B/pair
    one step of 2,000,000 records: 626.1 s, peak 949 MiB, 465 B/pair
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = r"""
import json, sys, time
def kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
import precguard as pc
from precguard.compare.report import Comparison
before = kb("VmRSS:")
t = time.perf_counter()
result = pc.compare_runs(sys.argv[1], sys.argv[2])
elapsed = time.perf_counter() - t
print(json.dumps({"seconds": elapsed, "before_kb": before, "peak_kb": kb("VmHWM:"),
                  "verdict": result.verdict, "records": len(result.records)}))
"""


def write_recording(path: Path, records: int, per_step: int, seed: int, noise: float) -> None:
    """Write a one-rank recording of ``records`` statistics records, ``per_step`` a step."""
    from precguard.dump.paths import RECORDS_FILE, rank_dir
    from precguard.dump.writer import RunWriter, prepare_run_dir

    steps = max(1, records // per_step)
    prepare_run_dir(path)
    writer = RunWriter(path, rank=0, world_size=1, model="Synthetic")
    writer.close(steps=steps)
    rng = random.Random(seed)  # the golden's values; the actual adds its own noise
    noisy = random.Random(seed + 1)
    lines = []
    out = open(rank_dir(path, 0) / RECORDS_FILE, "w", encoding="utf-8")  # noqa: SIM115
    with out:
        seq = 0
        for step in range(steps):
            rng.seed(step)
            for i in range(min(per_step, records - seq)):
                call, role = divmod(i, 2)
                module = f"model.layers.{call // 4}.mlp.fc{call % 4}"
                mean, std = rng.gauss(0.0, 0.1), abs(rng.gauss(1.0, 0.1))
                if noise:
                    mean *= 1 + noisy.gauss(0.0, noise)
                    std *= 1 + noisy.gauss(0.0, noise)
                name = "input" if role == 0 else "output"
                rec = {
                    "key": f"{module}.0.forward.{name}.0",
                    "module": module,
                    "module_type": "Linear",
                    "call": 0,
                    "phase": "forward",
                    "role": name,
                    "index": 0,
                    "name": "args.0" if role == 0 else "output",
                    "step": step,
                    "rank": 0,
                    "seq": seq,
                    "dtype": "float32",
                    "shape": [64, 64],
                    "stats": {
                        "min": mean - 4 * std,
                        "max": mean + 4 * std,
                        "mean": mean,
                        "std": std,
                        "absmax": abs(mean) + 4 * std,
                        "l2": 64.0 * (std * std + mean * mean) ** 0.5,
                        "nan": 0,
                        "inf": 0,
                        "zeros": 0,
                        "numel": 4096,
                    },
                }
                seq += 1
                lines.append(json.dumps(rec, separators=(",", ":")))
                if len(lines) >= 10000:
                    out.write("\n".join(lines) + "\n")
                    lines.clear()
        if lines:
            out.write("\n".join(lines) + "\n")


def measure(records: int, per_step: int, root: Path) -> dict[str, float]:
    """Write a pair of ``records`` records each, compare it in a fresh process, return figures."""
    golden, actual = root / f"golden-{records}", root / f"actual-{records}"
    write_recording(golden, records, per_step, seed=0, noise=0.0)
    write_recording(actual, records, per_step, seed=0, noise=1e-8)
    proc = subprocess.run(
        [sys.executable, "-c", _CHILD, str(golden), str(actual)],
        capture_output=True,
        text=True,
        check=True,
    )
    shutil.rmtree(golden)
    shutil.rmtree(actual)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    """Parse arguments, measure each record count, print one row each."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, nargs="+", default=[20000, 200000])
    parser.add_argument("--per-step", type=int, default=10000, help="records per step")
    parser.add_argument("--dir", type=Path, default=None, help="where to write (default: tmp)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="precguard-memory-", dir=args.dir))
    head = ("records", "steps", "seconds", "peak MiB", "growth MiB", "B/pair", "us/pair")
    print("{:>9} {:>6} {:>8} {:>9} {:>10} {:>7} {:>8}  verdict".format(*head))
    try:
        for n in args.records:
            t = time.perf_counter()
            r = measure(n, args.per_step, root)
            growth = (r["peak_kb"] - r["before_kb"]) * 1024
            print(
                f"{n:>9} {max(1, n // args.per_step):>6} {r['seconds']:>8.1f} "
                f"{r['peak_kb'] / 1024:>9.0f} {growth / 2**20:>10.0f} {growth / n:>7.0f} "
                f"{r['seconds'] / n * 1e6:>8.0f}  {r['verdict']} ({r['records']} records; "
                f"{time.perf_counter() - t:.0f}s with writing)",
                flush=True,
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
