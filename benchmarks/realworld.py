"""compare's verdicts in the stacks users run (issue 28): the real-stacks corpus, one line a pair.

Records every pair of ``tests/realstacks/corpus.py`` (PEFT LoRA, HF ``Trainer``,
Mixtral / Qwen2-MoE, sdpa vs eager, autocast, gradient checkpointing,
``torch.compile``, ``generate()`` with a KV cache, HF models cast to bf16), compares
it and prints the verdict, the module named and whether that is right, then the
false alarms on clean pairs and the planted faults named.

    .venv/bin/python benchmarks/realworld.py [--fast] [--only SUBSTRING] [--verbose]

Exit 1 on a false alarm or a missed fault.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# the table is the output: transformers' advice and tqdm's bars are not (set before import)
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TQDM_DISABLE", "1")

from tests.realstacks.corpus import CORPUS, run_case  # noqa: E402


def main() -> int:
    """Run the corpus and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fast", action="store_true", help="Only the test suite's subset.")
    parser.add_argument("--only", action="append", help="Only cases whose name contains this.")
    parser.add_argument("--verbose", action="store_true", help="Print compare's reason too.")
    args = parser.parse_args()
    cases = [c for c in CORPUS if not args.fast or c.fast]
    if args.only:
        cases = [c for c in cases if any(s in c.name for s in args.only)]
    start = time.perf_counter()
    outcomes = []
    if not cases:
        print(f"no case matches {args.only}", file=sys.stderr)
        return 2
    width = max(len(c.name) for c in cases) + 1
    with tempfile.TemporaryDirectory(prefix="precguard-realworld-") as tmp:
        for case in cases:
            # a stack's own prints (HF Trainer's metrics dict) are not the table's lines
            with contextlib.redirect_stdout(io.StringIO()):
                o = run_case(case, Path(tmp))
            outcomes.append(o)
            kind = "fault" if case.expect else "clean"
            mark = "ok  " if o.ok else ("MISS" if case.expect else "WRONG")
            print(
                f"{mark:5} {case.name:{width}} {kind:5} {o.verdict:8} exit {o.exit_code:2} "
                f"{o.named or '-':40.40} {o.seconds:5.1f}s",
                flush=True,
            )
            if args.verbose or (not o.ok and o.verdict == "error"):
                print(f"      {o.text[:400]}")
    clean = [o for o in outcomes if not o.case.expect]
    faults = [o for o in outcomes if o.case.expect]
    print()
    print(f"clean pairs: {len(clean)}, wrong verdicts: {sum(not o.ok for o in clean)}")
    print(f"planted faults: {len(faults)}, named: {sum(o.ok for o in faults)}")
    print(f"total {time.perf_counter() - start:.0f}s")
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    raise SystemExit(main())
