"""How long a checklist takes, per device, and each check's share of it.

For each device asked for, ``precguard.check`` runs the checklist in this
process (what ``precguard check`` runs) and prints its wall and process CPU
time, then per check, slowest first: the seconds the Diagnosis records
(``durations``, also in ``check --json``) and the **forward passes of the
target's model** the check ran (calls of the model's root class, counted with
a global forward pre-hook: a count no machine load changes, so two revisions
compare exactly on a busy machine). Timings belong here, where they are read,
not in a test that fails on a busy machine.

The default target is issue 41's: ``handwritten-llama``, a hand-written
decoder of 4 layers at hidden 128 (2 x 128 tokens); its goal is the whole
``llama-finetune`` checklist in <= 20 s. ``--target tiny-llama`` is the HF one.

    python benchmarks/checklist_speed.py [--checklist llama-finetune]
        [--target handwritten-llama] [--device emu:fp16 --device cpu] [--only env]
        [--top 14] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time
from collections import Counter

import torch
from torch.nn.modules.module import register_module_forward_pre_hook

import precguard

#: issue 41's goal for llama-finetune on handwritten-llama, seconds
GOAL_S = 20.0


def run_checklist(
    checklist: str, target: str, device: str, only: str | None
) -> tuple[float, float, int, dict[str, float], Counter[str]]:
    """Run one checklist; return (wall s, CPU s, exit code, s per check, forwards per check)."""
    root = type(precguard.load_target(target).model())
    current = ["(before the first check)"]
    forwards: Counter[str] = Counter()

    def count(module: torch.nn.Module, _args: object) -> None:
        if type(module) is root:
            forwards[current[0]] += 1

    def progress(check_id: str, _index: int, _total: int) -> None:
        current[0] = check_id

    handle = register_module_forward_pre_hook(count)
    try:
        start, cpu = time.perf_counter(), time.process_time()
        diagnosis = precguard.check(
            checklist,
            target,
            device=device,
            only=[only] if only else (),
            on_progress=progress,
        )
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    finally:
        handle.remove()
    return wall, cpu, diagnosis.exit_code, diagnosis.durations, forwards


def main_() -> None:
    """Parse the arguments and print one block per device."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checklist", default="llama-finetune")
    parser.add_argument("--target", default="handwritten-llama")
    parser.add_argument("--device", action="append", help="repeatable (default: emu:fp16, cpu)")
    parser.add_argument("--only", default=None, help="check families to run, as `check --only`")
    parser.add_argument("--top", type=int, default=14, help="checks listed per device")
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch intra-op threads (default: torch's). On a busy machine, 1 keeps CPU "
        "time honest: a second thread waiting for a core spins and counts as CPU time",
    )
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    for device in args.device or ["emu:fp16", "cpu"]:
        load = os.getloadavg()[0]
        wall, cpu, code, durations, forwards = run_checklist(
            args.checklist, args.target, device, args.only
        )
        print(
            f"checklist {args.checklist} on {args.target}, {device}: {wall:.1f} s wall, "
            f"{cpu:.1f} s CPU, {sum(forwards.values())} forward passes (exit code {code}; "
            f"goal <= {GOAL_S:.0f} s; load {load:.1f} -> {os.getloadavg()[0]:.1f} on "
            f"{os.cpu_count()} CPUs, {torch.get_num_threads()} torch threads)"
        )
        ranked = sorted(durations.items(), key=lambda kv: -kv[1])
        for check, took in ranked[: args.top]:
            print(f"  {took:7.2f} s  {forwards.get(check, 0):4d} forwards  {check}")
        rest = ranked[args.top :]
        if rest:
            print(
                f"  {sum(t for _, t in rest):7.2f} s  {sum(forwards.get(c, 0) for c, _ in rest):4d}"
                f" forwards  the other {len(rest)} checks"
            )


if __name__ == "__main__":
    main_()
