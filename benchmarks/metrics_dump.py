"""Cost of one metrics object: written to JSON, dumped as compare's rows dump it, validated.

Fixed work (``--n`` calls each, the best of five, CPU time): the per-record price of
the levels' serializer (compare/levels.py) apart from the rest of a record. Issue 38
chose that serializer with this script run on each alternative (docs/compare.md, 'One
model per level').

    PYTHONPATH=src python benchmarks/metrics_dump.py [--n 50000]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from precguard.compare.levels import FullMetrics, StatsMetrics, metrics_of


def _best(n: int, call: Callable[[], Any]) -> float:
    """µs per call, the least disturbed of five runs of ``n`` calls."""
    best = float("inf")
    for _ in range(5):
        t0 = time.process_time()
        for _ in range(n):
            call()
        best = min(best, time.process_time() - t0)
    return best / n * 1e6


def main() -> None:
    """Print µs per call for each level measured (full, stats) and each use."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=50_000)
    n = parser.parse_args().n
    full = FullMetrics(
        level="full", dtype="bfloat16", error=3e-3, max_abs_err=0.02, mean_abs_err=1e-3,
        max_rel_err=0.05, rmse=1.3e-3, rel_l2=3e-3, cosine=1 - 1e-6,
    )  # fmt: skip
    stats = StatsMetrics(
        level="stats", dtype="bfloat16", error=2e-3, stat_rel_diff={"min": 1e-3},
        sample_size=4096, sample_rel_l2=2e-3, pos_dim=1, note="statistics only",
    )  # fmt: skip
    for m in (full, stats):
        row = m.model_dump(mode="json", exclude_defaults=True)
        print(
            f"{m.level:6} json {_best(n, m.model_dump_json):5.2f} µs   "
            f"row {_best(n, lambda m=m: m.model_dump(mode='json', exclude_defaults=True)):5.2f} µs"
            f"   validate {_best(n, lambda row=row: metrics_of(row)):5.2f} µs   "
            f"fields {len(metrics_of(row).__dict__)}"
        )


if __name__ == "__main__":
    main()
