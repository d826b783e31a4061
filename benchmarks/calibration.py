"""Calibrate compare's expected-error judge on a corpus of clean and faulty pairs (issue 17).

Records every pair of ``tests/compare/calibration_corpus.py`` (goldens shared),
compares it and prints one line per pair (verdict, the module named, seconds
for recording the actual and comparing), then the false alarms on the clean
pairs, the faults localized by kind and magnitude, and the smallest magnitude
localized per kind. A pair that names a checklist (``Pair.checklist``) also
runs it on its actual: a clean pair must pass it, and a fault compare does not
name counts as named when the checklist names it (the line says ``by check <id>``;
docs/fp8.md: the shared block scale, named by ``fp8.saturation``).

    .venv/bin/python benchmarks/calibration.py [--fast] [--only SUBSTRING] [--verbose]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "compare"))

from calibration_corpus import (  # noqa: E402
    CORPUS,
    MAGNITUDES,
    Outcome,
    Runner,
    label,
    smallest_localized,
)

#: the torchrun tensor-parallel model of the layout tests and its layout spec
TP_DIR = ROOT / "tests" / "layout"


def main() -> int:
    """Run the corpus and print the table; exit 1 on a false alarm or a missed fault >= 1 %."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="Only the test suite's subset.")
    parser.add_argument("--only", action="append", help="Only pairs whose name contains this.")
    parser.add_argument("--verbose", action="store_true", help="Print compare's reason too.")
    args = parser.parse_args()
    pairs = [p for p in CORPUS if not args.fast or p.fast]
    if args.only:
        pairs = [p for p in pairs if any(s in p.name for s in args.only)]
    outcomes: list[Outcome] = []
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="precguard-calibration-") as tmp:
        runner = Runner(Path(tmp))
        for pair in pairs:
            o = runner.run(pair)
            if o is None:
                print(f"skip  {pair.name}: model not installed")
                continue
            outcomes.append(o)
            mark = "ok  " if o.ok else "MISS" if pair.expect else "FALSE ALARM"
            named = o.named or "-"
            if o.tool != "compare":
                named += f" (by {o.tool})"
            print(f"{mark:5} {pair.name:58} {o.verdict:8} {named:34} {o.seconds:5.1f}s")
            if pair.checklist and pair.expect is None:
                said = "FAIL" if o.checklist_failed else "pass"
                print(f"      checklist {pair.checklist}: {said}")
            if args.verbose and o.reason:
                print(f"      {o.reason}")
        tp_alarms, tp_missed = 0, 0
        if not args.fast and (not args.only or any("tp" in s for s in args.only)):
            tp_alarms, tp_missed = tensor_parallel(Path(tmp))
    clean = [o for o in outcomes if o.pair.expect is None]
    faults = [o for o in outcomes if o.pair.expect is not None]
    alarms = [o for o in clean if not o.ok]
    print()
    print(f"clean pairs: {len(clean)}, false alarms: {len(alarms)}")
    kinds = sorted({label(o.pair) for o in faults})
    width = max([len("fault, setting"), *map(len, kinds)]) + 2
    header = "fault, setting".ljust(width) + "".join(f"{m:>8.1%}" for m in MAGNITUDES)
    print(header + "  smallest localized")
    smallest = smallest_localized(faults)
    for kind in kinds:
        here_all = [o for o in faults if label(o.pair) == kind]
        if not here_all[0].pair.magnitude:
            ok = sum(o.ok for o in here_all)
            print(kind.ljust(width) + f"{ok}/{len(here_all)} localized (the classic bug)")
            continue
        row = kind.ljust(width)
        for m in MAGNITUDES:
            here = [o for o in here_all if o.pair.magnitude == m]
            row += f"{sum(o.ok for o in here)}/{len(here)}".rjust(8) if here else "-".rjust(8)
        best = smallest.get(kind)
        row += f"  {best:.1%}" if best is not None else "  none"
        print(row)
    missed = [o for o in faults if not o.ok and (o.pair.magnitude >= 0.01 or not o.pair.magnitude)]
    found = sum(o.ok for o in faults)
    print(f"faults localized: {found}/{len(faults)}; missed at >= 1 %: {len(missed)}")
    times = [o.seconds for o in outcomes]
    if times:
        print(
            f"time per pair (record actual + compare): mean {sum(times) / len(times):.1f}s, "
            f"max {max(times):.1f}s; total {time.perf_counter() - start:.0f}s"
        )
    return 1 if alarms or missed or tp_alarms or tp_missed else 0


def _tp_record(out: Path, *args: str, ranks: int = 2) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    launcher = [sys.executable]
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", f"--nproc-per-node={ranks}", "--standalone"]
    subprocess.run(
        [*launcher, str(TP_DIR / "tp_model.py"), str(out), *args],
        check=True, capture_output=True, timeout=600, env=env,
    )  # fmt: skip


def _tp_compare(golden: Path, actual: Path) -> dict:
    report = actual.with_suffix(".json")
    subprocess.run(
        [sys.executable, "-m", "precguard", "compare", str(golden), str(actual),
         "--layout", str(TP_DIR / "tp.yaml"), "--json", str(report)],
        capture_output=True, timeout=600,
    )  # fmt: skip
    return json.loads(report.read_text())


def tensor_parallel(tmp: Path) -> tuple[int, int]:
    """A torchrun 2-way tensor-parallel run against the whole model, clean and with a
    fault in rank 1's row-parallel shard (its partial sum, before the all-reduce).

    Returns (false alarms, faults >= 1 % missed)."""
    alarms = missed = 0
    start = time.perf_counter()
    whole = tmp / "tp-whole"
    _tp_record(whole, ranks=1)
    cases = [("clean", None)] + [(f"fault {m:.1%}", m) for m in MAGNITUDES]
    for name, m in cases:
        t0 = time.perf_counter()
        out = tmp / f"tp-{name.replace(' ', '-').replace('%', '')}"
        extra = () if m is None else ("--fault", "layers.0.attn.out", "--fault-scale", str(1 + m))
        _tp_record(out, *extra)
        result = _tp_compare(whole, out)
        first = result.get("first_divergence") or {}
        named = f"{first.get('module')} rank {first.get('rank')}" if first else "-"
        if m is None:
            mark = "ok  " if result["verdict"] == "match" else "FALSE ALARM"
            alarms += mark != "ok  "
        else:
            hit = (first.get("module"), first.get("rank")) == ("layers.0.attn.out", 1)
            mark = "ok  " if hit else "MISS"
            missed += not hit and m >= 0.01
        secs = time.perf_counter() - t0
        print(f"{mark:5} {'torchrun tp=2 vs whole, ' + name:58} {result['verdict']:8} "
              f"{named:34} {secs:5.1f}s")  # fmt: skip
    print(
        f"      torchrun pairs: {time.perf_counter() - start:.0f}s; false alarms {alarms}, "
        f"missed >= 1 % {missed} (not in the table below)"
    )
    return alarms, missed


if __name__ == "__main__":
    raise SystemExit(main())
