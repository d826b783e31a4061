"""Score compare's localization when the actual run is in bf16 (issue 8).

Runs the bf16 suite of ``tests/compare/bf16_suite.py``: for each setting
(bf16 on the CPU, ``emu:bf16`` and ``emu:bf16-mixed`` vs an fp32 golden with the
same bf16-rounded weights; ``emu:bf16-lowacc`` vs a bf16 golden) it records a clean
actual and one actual per planted fault, compares each with the golden and
prints, per setting and in total, how many faults compare localized (the
planted module is the first divergence and local) and whether the clean run
passed (match, no module named).

    .venv/bin/python benchmarks/bf16_localization.py [--setting NAME] [--verbose]
        [--hidden 64] [--layers 4] [--seq 32]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "compare"))

from bf16_suite import FAULTS, SETTINGS, llama_target, localized, passed_clean, record

import precguard


def main() -> None:
    """Record, compare and print the score."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--setting", action="append", help="Only these settings (repeatable).")
    parser.add_argument("--verbose", action="store_true", help="Say what compare named.")
    parser.add_argument("--hidden", type=int, default=64, help="Hidden size of the LLaMA.")
    parser.add_argument("--layers", type=int, default=4, help="Decoder layers (at least 4).")
    parser.add_argument("--seq", type=int, default=32, help="Tokens per sequence (batch 2).")
    args = parser.parse_args()
    target = llama_target(args.hidden, args.layers, args.seq)
    settings = [s for s in SETTINGS if not args.setting or s.name in args.setting]
    total_found = total_faults = clean_ok = 0
    with tempfile.TemporaryDirectory(prefix="precguard-bf16-") as tmp:
        root = Path(tmp)
        for setting in settings:
            golden = record(root / setting.name / "golden", setting.golden, target=target)
            clean_run = record(root / setting.name / "clean", setting.actual, target=target)
            clean = precguard.compare_runs(golden, clean_run)
            ok = passed_clean(clean)
            clean_ok += ok
            found = 0
            for fault in FAULTS:
                actual = record(root / setting.name / fault.name, setting.actual, fault, target)
                result = precguard.compare_runs(golden, actual)
                hit = localized(result, fault)
                found += hit
                if args.verbose:
                    fd = result.first_divergence
                    named = f"{fd.module} local={fd.local}" if fd else "nothing"
                    print(f"  {setting.name:18} {fault.name:26} {'ok ' if hit else 'MISS'} {named}")
            total_found += found
            total_faults += len(FAULTS)
            fd = clean.first_divergence
            clean_note = "passed" if ok else f"FAILED ({fd.module if fd else clean.verdict})"
            if args.verbose and not ok:
                print(f"  clean: {fd.reason if fd else clean.verdict}")
            print(f"{setting.name}: faults localized {found}/{len(FAULTS)}, clean run {clean_note}")
    print(
        f"score: faults localized {total_found}/{total_faults}, "
        f"clean runs passed {clean_ok}/{len(settings)}"
    )


if __name__ == "__main__":
    main()
