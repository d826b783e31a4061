"""How long a checklist takes on the built-in tiny LLaMA, per device.

The wall time of ``precguard check`` (in this process, as the CLI runs it),
for each device asked for. It used to be asserted in a test (under 120 s on
``emu:fp16``); timings belong here, where they are read, not in a test that
fails on a busy machine.

    python benchmarks/checklist_speed.py [--checklist llama-finetune]
        [--device emu:fp16 --device cpu] [--only env]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import time

from precguard.cli import main


def run_checklist(checklist: str, device: str, only: str | None) -> tuple[float, int]:
    """Run one checklist on ``device``; return (seconds, exit code). Output is swallowed."""
    argv = ["check", "--checklist", checklist, "--target", "tiny-llama", "--device", device]
    if only:
        argv += ["--only", only]
    start = time.perf_counter()
    code = 0
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            main(argv)
        except SystemExit as exc:
            code = int(exc.code or 0)
    return time.perf_counter() - start, code


def main_() -> None:
    """Parse the arguments and print one line per device."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checklist", default="llama-finetune")
    parser.add_argument("--device", action="append", help="repeatable (default: emu:fp16, cpu)")
    parser.add_argument("--only", default=None, help="check families to run, as `check --only`")
    args = parser.parse_args()
    for device in args.device or ["emu:fp16", "cpu"]:
        seconds, code = run_checklist(args.checklist, device, args.only)
        print(f"checklist {args.checklist} on {device}: {seconds:.1f} s (exit code {code})")


if __name__ == "__main__":
    main_()
