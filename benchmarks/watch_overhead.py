"""Step-time overhead of ``precguard.watch`` on a LLaMA training step, on the CPU.

A seeded 4-layer ``LlamaForCausalLM`` (hidden 1024, SwiGLU 2816, an 8k
vocabulary by default, ~68M parameters: LLaMA's 32k vocabulary, ``--vocab
32000``, takes 3 GiB of memory with AdamW's state and a recorded step's
parameter copy) trains with AdamW on one sequence of ``--seq`` tokens, its
gradients clipped to norm 1 as LLaMA recipes and the HF ``Trainer``
(``max_grad_norm=1.0``) do (``--no-clip``: no clipping). The modes share
the model and the optimizer and run in blocks interleaved within each
repeat, the order rotating from repeat to repeat, so drift in the machine's
load hits all alike:

* ``plain``: no watch;
* ``watch``: a watch at the default interval (``every=1000``) on steps that
  are not recorded, handed the norm ``clip_grad_norm_`` returned
  (``w.step(loss, grad_norm=norm)``): no pass of its own over the gradients;
* ``watch, own norms``: the same watch not handed the norm: its hooks take
  every parameter's gradient norm (one read of every gradient);
* ``every step``: ``every=1``, every step recorded (statistics of every
  module's activations and gradients, parameters, the update and AdamW's
  moments), handed the norm.

Each watched block opens a fresh watch, lets its step 0 (always recorded)
run untimed (not with ``every=1``, whose steps are all alike), then times
``--steps`` steps. Printed: median step time per
mode and, per mode, the median and quartiles of the per-repeat ratios
``block / plain block`` (side by side in one run), the amortized overhead at
the default interval ``watch + (every step - watch) / 1000`` against the
issue's goal of 2 %, and the machine's load (``uptime``) before and after.

On a loaded machine the difference of two step times is noisier than a
small overhead, so the watch's own work is also timed directly, as fixed
work repeated ``--own-repeats`` times on the model's real gradients: the
gradient hooks the backward pass runs (on: each parameter's norm; off: a
bare Python call each) and ``watch.step()`` (the update-ratio sample, the
one fetch, the detectors, the files), as a fraction of the median plain step.

msprobe's monitor (``msprobe.pytorch.TrainerMon``, PyPI ``mindstudio-probe``)
is measured side by side in a child process when it is importable (it
patches the optimizer's ``step`` and a torch class for good, so not in the
process that times precguard): ``plain`` against ``TrainerMon`` at
``step_interval`` 1000 and 1, with every module's activations
(``all_xy``), weight gradients, AdamW's moments, norm and NaN-count
statistics and its turbulence alert rule.

    .venv/bin/python benchmarks/watch_overhead.py [--repeats 5] [--steps 2] [--seq 128]
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

GOAL = 0.02
DEFAULT_EVERY = 1000


def build(hidden: int, layers: int, vocab: int) -> torch.nn.Module:
    """A seeded LLaMA of ``layers`` layers and ``hidden`` width, 64-wide heads."""
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


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile) of ``values``."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


class Bench:
    """The model, its optimizer, the batch and one timed training step."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.model = build(args.hidden, args.layers, args.vocab)
        self.params = sum(p.numel() for p in self.model.parameters())
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=1e-4)
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, args.vocab, (1, args.seq), generator=gen)
        self.clip = args.clip
        #: seconds inside the watch's step() (or the monitor's), per timed step
        self.inside: list[float] = []

    def step(self, end: Callable[[torch.Tensor, torch.Tensor | None], object] | None) -> float:
        """One training step, timed; ``end(loss, norm)`` is the monitor's per-step call."""
        start = time.perf_counter()
        loss = self.model(input_ids=self.ids, labels=self.ids).loss
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0) if self.clip else None
        self.opt.step()
        self.opt.zero_grad()
        if end is not None:
            before = time.perf_counter()
            end(loss, norm)
            self.inside.append(time.perf_counter() - before)
        return time.perf_counter() - start


def interleaved(
    bench: Bench,
    modes: dict[str, Callable[[], object] | None],
    repeats: int,
    steps: int,
    unwarmed: frozenset[str] = frozenset(),
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Block medians per mode and per-repeat ratios to ``plain``, modes interleaved.

    ``modes``: name -> a factory of a context manager yielding the per-step call
    (None: plain). Each block's first step runs untimed (a watch records its
    step 0), except in ``unwarmed`` modes, whose every step is alike.
    """
    names = list(modes)
    times: dict[str, list[float]] = {m: [] for m in names}
    ratios: dict[str, list[float]] = {m: [] for m in names if m != "plain"}
    for r in range(repeats):
        block: dict[str, float] = {}
        for mode in names[r % len(names) :] + names[: r % len(names)]:
            factory = modes[mode]
            if factory is None:
                block[mode] = statistics.median(bench.step(None) for _ in range(steps))
                continue
            with factory() as end:  # type: ignore[attr-defined]
                if mode not in unwarmed:
                    bench.step(end)  # step 0: always recorded (msprobe: collected), untimed
                block[mode] = statistics.median(bench.step(end) for _ in range(steps))
        for mode, t in block.items():
            times[mode].append(t)
        for mode in ratios:
            ratios[mode].append(block[mode] / block["plain"])
        print(f"repeat {r}: " + "  ".join(f"{m} {block[m]:.3f}s" for m in names), flush=True)
    return times, ratios


def report(times: dict[str, list[float]], ratios: dict[str, list[float]]) -> None:
    """Print the median step per mode and the quartiles of the per-repeat ratios."""
    print()
    for mode, t in times.items():
        line = f"{mode:>24}: median step {statistics.median(t):.3f}s"
        if mode in ratios:
            lo, mid, hi = quartiles(ratios[mode])
            line += f", {mid:.4f}x plain (per-repeat ratios: quartiles {lo:.4f}..{hi:.4f})"
        print(line)


class _Watch:
    """A fresh ``precguard.watch`` as a context manager yielding its per-step call."""

    def __init__(self, bench: Bench, out: Path, every: int, hand_norm: bool) -> None:
        self.bench, self.out, self.every, self.hand_norm = bench, out, every, hand_norm

    def __enter__(self) -> Callable[[torch.Tensor, torch.Tensor | None], object]:
        import precguard

        self.w = precguard.watch(
            self.bench.model, self.bench.opt, every=self.every, out=self.out, overwrite=True
        )
        if self.hand_norm:
            return lambda loss, norm: self.w.step(loss, grad_norm=norm)
        return lambda loss, _norm: self.w.step(loss)

    def __exit__(self, *exc: object) -> None:
        self.w.close()


def own_work(bench: Bench, tmp: Path, repeats: int) -> dict[str, float]:
    """Median seconds of the watch's per-step work, as fixed work on real gradients."""
    import precguard

    loss = bench.model(input_ids=bench.ids, labels=bench.ids).loss
    loss.backward()
    norm = torch.nn.utils.get_total_norm([p.grad for p in bench.model.parameters()])
    out: dict[str, list[float]] = {"hooks on": [], "hooks off": [], "step()": []}
    with precguard.watch(bench.model, bench.opt, out=tmp / "own", overwrite=True) as w:
        w.step(loss.detach(), grad_norm=norm)  # step 0 (recorded), untimed
        pulse = w.pulse
        # the exact functions backward runs, one per parameter
        hooks = [(pulse._grad_hook(i), p) for i, (_n, p) in enumerate(pulse.params)]
        for _ in range(repeats):
            for mode, on in (("hooks on", True), ("hooks off", False)):
                pulse.layer_grads = on
                start = time.perf_counter()
                for hook, p in hooks:
                    hook(p)
                out[mode].append(time.perf_counter() - start)
            pulse.layer_grads = False
            pulse._grad_norms[:] = [None] * len(pulse.params)
            start = time.perf_counter()
            w.step(loss.detach(), grad_norm=norm)
            out["step()"].append(time.perf_counter() - start)
    bench.opt.zero_grad()
    return {m: statistics.median(v) for m, v in out.items()}


def precguard_suite(args: argparse.Namespace) -> None:
    """Interleaved side-by-side step times and the directly timed own work."""
    bench = Bench(args)
    print(
        f"model: {args.layers} layers, hidden {args.hidden}, {bench.params / 1e6:.0f}M "
        f"parameters, seq {args.seq}, AdamW, clip_grad_norm_ {'1.0' if args.clip else 'off'}"
    )
    bench.step(None)  # AdamW's state and the first-call costs, untimed
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)

        def make(every: int, hand: bool, name: str) -> Callable[[], _Watch]:
            return lambda: _Watch(bench, tmp / name, every, hand)

        modes: dict[str, Callable[[], object] | None] = {"plain": None}
        if args.clip:
            modes["watch"] = make(DEFAULT_EVERY, True, "watch")
        modes["watch, own norms"] = make(DEFAULT_EVERY, False, "own")
        modes["every step"] = make(1, args.clip, "every")
        every_modes = frozenset({"every step"})
        times, ratios = interleaved(bench, modes, args.repeats, args.steps, every_modes)
        report(times, ratios)
        plain = statistics.median(times["plain"])
        main = "watch" if args.clip else "watch, own norms"
        between = statistics.median(ratios[main]) - 1
        every = statistics.median(ratios["every step"]) - 1
        amortized = between + (every - between) / DEFAULT_EVERY
        verdict = "meets" if amortized <= GOAL else "misses"
        print(
            f"side by side, amortized overhead of '{main}' at every={DEFAULT_EVERY}: "
            f"{amortized * 100:+.2f}% ({verdict} the {GOAL * 100:.0f}% goal; the quartiles "
            "above are the machine's noise)"
        )
        own = own_work(bench, tmp, args.own_repeats)
    handed = own["step()"] + own["hooks off"]
    computed = own["step()"] + own["hooks on"]
    print(
        f"watch's own work per step, timed directly ({args.own_repeats} repeats, medians): "
        f"step() {own['step()'] * 1e3:.1f} ms, gradient hooks {own['hooks off'] * 1e3:.2f} ms "
        f"off / {own['hooks on'] * 1e3:.1f} ms on (each parameter's norm)"
    )
    print(
        f"  = {handed / plain * 100:.2f}% of the median plain step handed the clip norm, "
        f"{computed / plain * 100:.2f}% taking its own norms; amortized with a recorded "
        f"step every {DEFAULT_EVERY}: "
        f"{(handed / plain + (every - handed / plain) / DEFAULT_EVERY) * 100:.2f}% / "
        f"{(computed / plain + (every - computed / plain) / DEFAULT_EVERY) * 100:.2f}%"
    )


class _TrainerMon:
    """A fresh msprobe ``TrainerMon`` on the model, removed (and the optimizer restored) after."""

    def __init__(self, bench: Bench, tmp: Path, interval: int) -> None:
        self.bench, self.tmp, self.interval = bench, tmp, interval

    def __enter__(self) -> Callable[[torch.Tensor, torch.Tensor | None], object]:
        from msprobe.pytorch import TrainerMon

        config = {
            "targets": {},
            "all_xy": True,
            "xy_distribution": True,
            "wg_distribution": True,
            "mv_distribution": True,
            "ops": ["norm", "nans"],
            "format": "csv",
            "step_interval": self.interval,
            "alert": {"rules": [{"rule_name": "AnomalyTurbulence", "args": {"threshold": 0.5}}]},
        }
        path = self.tmp / f"msprobe-{self.interval}.json"
        path.write_text(json.dumps(config))
        opt = self.bench.opt
        self.saved_step = opt.__dict__.get("step")
        self.mon = TrainerMon(str(path), params_have_main_grad=False)
        self.mon.set_monitor(self.bench.model, grad_acc_steps=1, optimizer=opt)
        return lambda _loss, _norm: None  # it works inside optimizer.step()

    def __exit__(self, *exc: object) -> None:
        opt = self.bench.opt
        self.mon._remove_all_hooks_final(opt)
        if self.saved_step is None:
            opt.__dict__.pop("step", None)
        else:
            opt.step = self.saved_step


def msprobe_suite(args: argparse.Namespace) -> None:
    """Plain against msprobe's TrainerMon at interval 1000 and 1, interleaved (a child process)."""
    import logging

    logging.disable(logging.INFO)  # its alerts log one line per tensor
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        os.environ["MONITOR_OUTPUT_DIR"] = str(tmp / "out")
        bench = Bench(args)
        bench.step(None)
        modes: dict[str, Callable[[], object] | None] = {
            "plain": None,
            f"msprobe every={DEFAULT_EVERY}": lambda: _TrainerMon(bench, tmp, DEFAULT_EVERY),
            "msprobe every step": lambda: _TrainerMon(bench, tmp, 1),
        }
        every_modes = frozenset({"msprobe every step"})
        times, ratios = interleaved(bench, modes, args.repeats, args.steps, every_modes)
        report(times, ratios)


def breakdown(args: argparse.Namespace) -> None:
    """Where a plain step's time goes, and what one pass over every gradient costs."""
    bench = Bench(args)
    model, opt = bench.model, bench.opt
    bench.step(None)
    parts: dict[str, list[float]] = {}

    def timed(name: str, fn: Callable[[], object]) -> object:
        start = time.perf_counter()
        result = fn()
        parts.setdefault(name, []).append(time.perf_counter() - start)
        return result

    for _ in range(args.steps):
        loss = timed("forward", lambda: model(input_ids=bench.ids, labels=bench.ids).loss)
        timed("backward", loss.backward)  # type: ignore[attr-defined]
        grads = [p.grad for p in model.parameters()]

        def per_parameter(grads: list[torch.Tensor] = grads) -> object:
            return [torch.linalg.vector_norm(g, dtype=torch.float32) for g in grads]

        def fused(grads: list[torch.Tensor] = grads) -> object:
            return torch._foreach_norm(grads)

        for _ in range(5):
            timed("pass: vector_norm per parameter", per_parameter)
            timed("pass: _foreach_norm (one call)", fused)
        timed("clip_grad_norm_", lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0))
        timed("optimizer.step", opt.step)
        timed("zero_grad", opt.zero_grad)
    step = sum(statistics.median(parts[k]) for k in parts if not k.startswith("pass"))
    size = sum(p.numel() * p.element_size() for p in model.parameters()) / 1e6
    print(f"one plain step, by part (medians of {args.steps}; gradients {size:.0f} MB):")
    for name, t in parts.items():
        med = statistics.median(t)
        print(f"  {name:>32}: {med * 1e3:8.1f} ms  {med / step:6.2%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="timed steps per block")
    parser.add_argument("--own-repeats", type=int, default=20)
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--no-clip", dest="clip", action="store_false")
    parser.add_argument("--no-msprobe", dest="msprobe", action="store_false")
    parser.add_argument(
        "--breakdown", action="store_true", help="only time a plain step's parts and one pass"
    )
    parser.add_argument("--msprobe-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.breakdown:
        print(f"load before: {uptime()}")
        breakdown(args)
        print(f"load after: {uptime()}")
        return
    if args.msprobe_child:
        msprobe_suite(args)
        return

    print(f"load before: {uptime()}")
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    precguard_suite(args)
    gc.collect()
    if not args.msprobe:
        pass
    elif importlib.util.find_spec("msprobe.pytorch") is None:
        print("\nmsprobe's monitor (TrainerMon): not importable here, not measured side by side")
    else:
        print(f"\nmsprobe's monitor (TrainerMon), side by side in a child process ({uptime()}):")
        child = [a for a in sys.argv[1:] if a != "--no-msprobe"] + ["--msprobe-child"]
        done = subprocess.run(
            [sys.executable, __file__, *child], capture_output=True, text=True, check=False
        )
        # msprobe prints its own log lines (and warnings) on stdout and stderr: keep ours
        ours = [x for x in done.stdout.splitlines() if x.startswith("repeat ") or "median" in x]
        failed = f"  failed (exit {done.returncode}): {done.stderr[-500:]}"
        print("\n".join(ours) if ours else failed)
    print(f"load after: {uptime()}")


if __name__ == "__main__":
    main()
