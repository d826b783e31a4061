"""How long the HTML report of a large comparison takes to render, and how big it is.

Records tiny-llama for a few training steps (statistics only, a planted 0.1%
output drift in one layer plus benign reduction-order noise), compares, then
repeats the records over more steps until the comparison holds ``--records``
records, the size of a real model's, and renders the HTML page and the CSV.

    .venv/bin/python benchmarks/report_size.py --records 50000
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    """Print records, seconds and megabytes for the HTML report and the CSV."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--steps", type=int, default=4, help="training steps recorded")
    args = parser.parse_args()

    from tests.compare.conftest import FAULTS, record

    import precguard
    from precguard.compare.report import Comparison
    from precguard.report.comparison import render_comparison_html
    from precguard.report.csv_table import comparison_csv

    fault = next(f for f in FAULTS if f.name == "output-drift-0.1pct")
    with tempfile.TemporaryDirectory() as tmp:
        kw = {"tensors": False, "steps": args.steps, "train": True}
        golden = record(Path(tmp) / "golden", **kw)
        actual = record(Path(tmp) / "actual", fault=fault, noise=True, **kw)
        result = precguard.compare_runs(golden, actual)
    data = result.model_dump(mode="json")
    base = data["records"]
    copies = max(1, -(-args.records // len(base)))
    data["records"] = [
        {**r, "step": r["step"] + args.steps * k} for k in range(copies) for r in base
    ][: args.records]
    big = Comparison.model_validate(data)
    start = time.perf_counter()
    page = render_comparison_html(big)
    html_s = time.perf_counter() - start
    start = time.perf_counter()
    table = comparison_csv(big)
    csv_s = time.perf_counter() - start
    print(f"records {len(big.records)}")
    print(f"html    {html_s:6.2f} s  {len(page.encode()) / 1e6:6.2f} MB")
    print(f"csv     {csv_s:6.2f} s  {len(table.encode()) / 1e6:6.2f} MB")


if __name__ == "__main__":
    main()
