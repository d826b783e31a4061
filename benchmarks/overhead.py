"""Overhead of ``precguard.monitor`` (statistics only) on a LLaMA forward, on the CPU.

Prints the ratio of the median forward time under ``monitor`` to the plain
forward, measured side by side (alternating) in one process, and the
recording's size per step. Goal: ratio <= 1.25. Then the same for a training
step (forward and backward), with and without the gradients w.r.t. module
inputs (``input_grads``), unless ``--no-backward``.

    .venv/bin/python benchmarks/overhead.py [--hidden 1024 --layers 4 --batch 2 --seq 128]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import torch


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument(
        "--no-backward", action="store_true", help="Skip the forward+backward measurement."
    )
    args = parser.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    import precguard
    from precguard.capture.monitor import Monitor
    from precguard.capture.options import CaptureOptions
    from precguard.capture.recording import Recording

    cfg = LlamaConfig(
        hidden_size=args.hidden,
        intermediate_size=int(args.hidden * 2.75),
        num_hidden_layers=args.layers,
        num_attention_heads=args.hidden // 64,
        num_key_value_heads=args.hidden // 64,
        vocab_size=32000,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, cfg.vocab_size, (args.batch, args.seq))

    plain: list[float] = []
    monitored: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, torch.no_grad():
        out = Path(tmp) / "run"
        for _ in range(2):  # warm-up
            model(ids)
        options = CaptureOptions()
        recording = Recording(out, options)
        for i in range(args.repeats + 1):
            # Hooks are attached only around the monitored forward, so the plain
            # forward runs with no hook at all; both alternate in one process.
            mon = Monitor(model, recording, options)
            t0 = time.perf_counter()
            model(ids)
            t1 = time.perf_counter()
            mon.remove()
            t2 = time.perf_counter()
            model(ids)
            t3 = time.perf_counter()
            if i:  # step 0 also records parameter statistics once
                monitored.append(t1 - t0)
                plain.append(t3 - t2)
        recording.close()
        size = (out / "rank0" / "records.jsonl").stat().st_size
        steps = precguard.load_run(out).manifest.steps or 1
        n_records = sum(1 for _ in precguard.load_run(out).records())

    ratio = statistics.median(monitored) / statistics.median(plain)
    print(
        f"model: LlamaForCausalLM hidden={args.hidden} layers={args.layers} "
        f"batch={args.batch}x{args.seq} threads={torch.get_num_threads()}"
    )
    print(f"plain forward median:     {statistics.median(plain) * 1e3:8.1f} ms")
    print(f"monitored forward median: {statistics.median(monitored) * 1e3:8.1f} ms")
    print(f"overhead ratio:           {ratio:8.3f}x  (goal <= 1.25x)")
    print(f"recording: {n_records / steps:.0f} records/step, {size / steps / 1024:.1f} KiB/step")
    if not args.no_backward:
        train_overhead(model.train(), ids, args.repeats)


def train_overhead(model: torch.nn.Module, ids: torch.Tensor, repeats: int) -> None:
    """Median forward+backward time: plain, monitored, monitored with input gradients."""
    from precguard.capture.monitor import Monitor
    from precguard.capture.options import CaptureOptions
    from precguard.capture.recording import Recording

    def train_step() -> None:
        model(ids, labels=ids).loss.backward()
        model.zero_grad(set_to_none=True)

    configs = {
        "plain": None,
        "monitored, no input grads": CaptureOptions(input_grads=False),
        "monitored, input grads": CaptureOptions(input_grads=True),
    }
    times: dict[str, list[float]] = {name: [] for name in configs}
    train_step()  # warm-up
    with tempfile.TemporaryDirectory() as tmp:
        recordings = {
            name: Recording(Path(tmp) / str(i), opts)
            for i, (name, opts) in enumerate(configs.items())
            if opts is not None
        }
        for i in range(repeats + 1):
            for name, opts in configs.items():  # interleaved, so drift hits all alike
                mon = Monitor(model, recordings[name], opts) if opts is not None else None
                t0 = time.perf_counter()
                train_step()
                if mon is not None:
                    recordings[name].flush()  # the backward records of this step
                t1 = time.perf_counter()
                if mon is not None:
                    mon.remove()
                if i:
                    times[name].append(t1 - t0)
        for rec in recordings.values():
            rec.close()
    base = statistics.median(times["plain"])
    print(f"{'plain forward+backward median:':<30}{base * 1e3:8.1f} ms")
    for name in list(configs)[1:]:
        med = statistics.median(times[name])
        print(f"{name + ' median:':<30}{med * 1e3:8.1f} ms  ({med / base:.3f}x)")
    with_in = statistics.median(times["monitored, input grads"])
    without = statistics.median(times["monitored, no input grads"])
    print(f"input-gradient recording costs: {with_in / without:8.3f}x of monitored")


if __name__ == "__main__":
    main()
