"""Step-time overhead of ``precguard.watch`` on a LLaMA training step, on the CPU.

A seeded 4-layer ``LlamaForCausalLM`` (hidden 1024, SwiGLU 2816, an 8k
vocabulary by default, ~67M parameters: LLaMA's 32k vocabulary, ``--vocab
32000``, takes 3 GiB of memory with AdamW's state and a recorded step's
parameter copy) trains with AdamW on one sequence of ``--seq`` tokens.
Three modes share the model and the optimizer and run in blocks
interleaved within each repeat, the order rotating from repeat to repeat,
so drift in the machine's load hits all alike:

* ``plain``: no watch;
* ``between``: a watch at the default interval (``every=1000``) on a step
  that is not recorded: the per-step scalars only (gradient-norm hooks,
  the sampled update ratio, one fetch);
* ``every``: ``every=1``, every step recorded (statistics of every module's
  activations and gradients, parameters, the update and AdamW's moments).

Each watched block opens a fresh watch, lets its step 0 (always recorded)
run untimed, then times ``--steps`` steps. Printed: median step time per
mode, the overhead ratios of the medians, the quartiles of the per-repeat
ratios (the machine's noise), the amortized overhead at the default
interval, ``between + (every - between) / 1000``, against the issue's
goal of 2 %, and the machine's load (``uptime``) before and after.

On a loaded machine the difference of two step times is noisier than the
overhead itself, so the watch's own work is also timed directly: the time
inside ``watch.step()`` (the fetch, the detectors, the files) and, timed
alone on the model's gradients, the per-parameter gradient norms its
backward hooks take, as a fraction of the plain step.

msprobe's monitor (``msprobe.pytorch.TrainerMon``) is not installed here;
when it is importable this script says so, but it does not drive it (its
configuration is a JSON file of its own); its documentation reports
4 s -> 4.25 s per step (~6 %).

    .venv/bin/python benchmarks/watch_overhead.py [--repeats 5] [--steps 2] [--seq 128]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

import torch

GOAL = 0.02
DEFAULT_EVERY = 1000


def build(hidden: int, layers: int, vocab: int) -> torch.nn.Module:
    """A seeded LLaMA of ``layers`` layers and ``hidden`` width, 64-wide heads, 32k vocab."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=int(hidden * 2.75),
        num_hidden_layers=layers,
        num_attention_heads=hidden // 64,
        num_key_value_heads=hidden // 64,
        vocab_size=vocab,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(cfg).train()


def uptime() -> str:
    """The ``uptime`` line (load averages)."""
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "uptime unavailable"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per block")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    args = parser.parse_args()

    import precguard

    print(f"load before: {uptime()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    model = build(args.hidden, args.layers, args.vocab)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, args.vocab, (1, args.seq), generator=gen)
    print(f"model: {args.layers} layers, hidden {args.hidden}, {params / 1e6:.0f}M parameters")

    inside_step: list[float] = []

    def train_step(handle: object | None) -> float:
        start = time.perf_counter()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        if handle is not None:
            before = time.perf_counter()
            handle.step()
            inside_step.append(time.perf_counter() - before)
        return time.perf_counter() - start

    def gradient_norms_alone() -> float:
        grads = [torch.randn_like(p) for p in model.parameters()]
        start = time.perf_counter()
        for g in grads:
            torch.linalg.vector_norm(g, dtype=torch.float32)
        return time.perf_counter() - start

    train_step(None)  # AdamW's state and the first-call costs, untimed
    times: dict[str, list[float]] = {"plain": [], "between": [], "every": []}
    ratios: dict[str, list[float]] = {"between": [], "every": []}
    modes = list(times)
    own_step: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.repeats):
            block: dict[str, float] = {}
            for mode in modes[r % 3 :] + modes[: r % 3]:
                if mode == "plain":
                    block[mode] = statistics.median(train_step(None) for _ in range(args.steps))
                    continue
                every = DEFAULT_EVERY if mode == "between" else 1
                out = Path(tmp) / f"{mode}-{r}"
                with precguard.watch(model, opt, every=every, out=out) as w:
                    train_step(w)  # step 0: always recorded, untimed
                    inside_step.clear()
                    block[mode] = statistics.median(train_step(w) for _ in range(args.steps))
                    if mode == "between":
                        own_step.extend(inside_step)
            for mode, t in block.items():
                times[mode].append(t)
            for mode in ratios:
                ratios[mode].append(block[mode] / block["plain"])
            print(
                f"repeat {r}: plain {block['plain']:.3f}s  between {block['between']:.3f}s  "
                f"every {block['every']:.3f}s",
                flush=True,
            )
    med = {m: statistics.median(v) for m, v in times.items()}
    print()
    print(f"median step: plain {med['plain']:.3f}s, between samples {med['between']:.3f}s, "
          f"every step recorded {med['every']:.3f}s")  # fmt: skip
    for mode in ratios:
        q = statistics.quantiles(ratios[mode], n=4) if len(ratios[mode]) > 1 else ratios[mode] * 3
        print(
            f"{mode:>8}: {med[mode] / med['plain']:.4f}x plain (per-repeat ratios: quartiles "
            f"{q[0]:.4f}..{q[-1]:.4f})"
        )
    between = med["between"] / med["plain"] - 1
    every = med["every"] / med["plain"] - 1
    amortized = between + (every - between) / DEFAULT_EVERY
    verdict = "meets" if amortized <= GOAL else "misses"
    print(
        f"amortized overhead at every={DEFAULT_EVERY}: {amortized * 100:+.2f}% "
        f"({verdict} the {GOAL * 100:.0f}% goal)"
    )
    norms = statistics.median(gradient_norms_alone() for _ in range(3))
    own = statistics.median(own_step) + norms
    print(
        f"watch's own work between samples: step() {statistics.median(own_step) * 1e3:.1f} ms "
        f"+ gradient norms {norms * 1e3:.1f} ms = {own / med['plain'] * 100:.2f}% of the "
        "plain step"
    )
    if importlib.util.find_spec("msprobe") is None:
        print("msprobe's monitor (TrainerMon): not installed here, not measured side by side")
    else:
        print("msprobe is installed; its TrainerMon is not driven by this script")
    print(f"load after: {uptime()}")


if __name__ == "__main__":
    main()
