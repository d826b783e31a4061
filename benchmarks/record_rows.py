"""Memory and speed of compare's compact record store (:class:`RecordRows`), fixed work.

Builds 100k synthetic RecordResults of the three kinds a comparison holds
(full-tensor pairs with every metric, statistics-only pairs with a sample,
positions and the shared note, missing records), stores them, and reads them
back. Prints bytes per row (the rows' JSON, and what tracemalloc sees the
store take) and microseconds per row to encode and to decode.

    PYTHONPATH=src python benchmarks/record_rows.py [--n 100000]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc

from precguard.compare.levels import FullMetrics, StatsMetrics
from precguard.compare.report import RecordResult, RecordRows

_STATS_NOTE = "statistics only: the tensors were not recorded (use --tensors to record them)"


def _result(i: int) -> RecordResult:
    kind = i % 3
    ident = {
        "key": f"model.layers.{i % 32}.mlp.down_proj.{i // 96}.forward.output.0",
        "module": f"model.layers.{i % 32}.mlp.down_proj",
        "module_type": "Linear",
        "call": i // 96,
        "step": 0,
        "rank": 0,
        "phase": "forward",
        "role": "output",
        "index": 0,
        "golden_dtype": "bfloat16",
        "shape": [4, 128, 4096],
        "seq": i,
    }
    if kind == 2:
        return RecordResult(status="missing", **ident)
    x = 1.0 + i * 1e-7
    if kind == 0:
        metrics: FullMetrics | StatsMetrics = FullMetrics(
            level="full",
            dtype="bfloat16",
            error=x * 3e-3,
            max_abs_err=x * 0.02,
            mean_abs_err=x * 1e-3,
            max_rel_err=x * 0.05,
            rmse=x * 1.3e-3,
            rel_l2=x * 3e-3,
            cosine=1 - x * 1e-6,
        )
    else:
        metrics = StatsMetrics(
            level="stats",
            dtype="bfloat16",
            error=x * 2e-3,
            stat_rel_diff={"min": x * 1e-3, "max": x * 2e-3, "mean": x * 1e-4, "norm": x * 1e-3},
            sample_size=4096,
            sample_rel_l2=x * 2e-3,
            sample_max_abs=x * 0.01,
            sample_rse=0.02,
            pos_dim=1,
            pos_bin=1,
            pos_worst=i % 128,
            pos_worst_err=x * 4e-3,
            pos_rel_l2=x * 1e-3,
            note=_STATS_NOTE,
        )
    status = "fail" if i % 7 == 0 else "pass"
    return RecordResult(status=status, metrics=metrics, **ident)


def main() -> None:
    """Print bytes/row and µs/row for encoding and decoding ``--n`` results."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    n = parser.parse_args().n
    results = [_result(i) for i in range(n)]

    # CPU time, the best of three (the machine is shared: the least disturbed run)
    encode = decode = float("inf")
    for _ in range(3):
        t0 = time.process_time()
        rows = RecordRows(results)
        encode = min(encode, time.process_time() - t0)
        t0 = time.process_time()
        n_read = sum(1 for _ in rows)
        decode = min(decode, time.process_time() - t0)
    del rows
    # memory apart: tracemalloc slows allocation down, so it is not on while timing
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    rows = RecordRows(results)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()

    assert n_read == n and rows[n - 1] == results[n - 1] and rows[1] == results[1]

    print(f"records             {n}")
    print(f"row JSON bytes/row  {rows.nbytes() / n:.0f}")
    print(f"memory bytes/row    {held / n:.0f}  (tracemalloc, the store)")
    print(f"encode µs/row       {encode / n * 1e6:.1f}")
    print(f"decode µs/row       {decode / n * 1e6:.1f}")


if __name__ == "__main__":
    main()
