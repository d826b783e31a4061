"""Run a checklist from Python and act on the diagnosis.

    python examples/checklist/diagnose.py [DEVICE [diagnosis.json]]

Runs ``my-port.yaml`` on the built-in tiny-llama target against the CPU,
prints the most likely root cause with its remedy, optionally writes the
diagnosis as JSON, and exits like the CLI (0 pass, 1 fail).
"""

from __future__ import annotations

import sys
from pathlib import Path

import precguard

HERE = Path(__file__).parent


def main(device: str = "emu:bf16", json_out: str | None = None) -> int:
    diagnosis = precguard.check(HERE / "my-port.yaml", "tiny-llama", device=device)
    print(f"{diagnosis.checklist} on {device}: {diagnosis.verdict} {diagnosis.counts}")
    cause = diagnosis.root_cause
    if cause is not None:
        print(f"most likely root cause: {cause.id}: {cause.summary}")
        print(f"remedy: {cause.remedy}")
    if json_out:
        Path(json_out).write_text(diagnosis.model_dump_json(indent=2), encoding="utf-8")
        print(f"wrote {json_out}")
    return diagnosis.exit_code


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
