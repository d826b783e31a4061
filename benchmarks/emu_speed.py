"""How fast the ``emu:`` emulator is against native low-precision CPU kernels.

Times one matmul (256×1024 by 1024×1024, docs/emu.md) and one tiny-LLaMA
forward pass: fp32, native fp16/bf16 (the tensors converted), and each
emulated profile (fp32 tensors, rounded per op).

    python benchmarks/emu_speed.py [--m 256 --k 1024 --n 1024] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from precguard import plugins

PROFILES = ("fp16", "bf16", "fp16-saturate", "fp16-lowacc", "fp32-shuffled")


def best_ms(fn: Callable[[], object], repeats: int) -> float:
    """Best wall time of ``repeats`` calls, in milliseconds (after one warm-up)."""
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times) * 1000


def emulated(profile: str, fn: Callable[[], object]) -> Callable[[], object]:
    """``fn`` run inside ``emu:PROFILE``'s numerics."""
    backend = plugins.get_backend(f"emu:{profile}")
    assert backend is not None

    def run() -> object:
        with backend.numerics():
            return fn()

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--m", type=int, default=256)
    parser.add_argument("--k", type=int, default=1024)
    parser.add_argument("--n", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-llama", action="store_true", help="Skip the tiny-LLaMA forward.")
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(args.m, args.k, generator=gen)
    b = torch.randn(args.k, args.n, generator=gen)
    rows = [("matmul fp32", best_ms(lambda: a @ b, args.repeats))]
    for dtype in (torch.float16, torch.bfloat16):
        a_low, b_low = a.to(dtype), b.to(dtype)
        rows.append(
            (f"matmul native {dtype}", best_ms(lambda x=a_low, y=b_low: x @ y, args.repeats))
        )
    for profile in PROFILES:
        rows.append(
            (f"matmul emu:{profile}", best_ms(emulated(profile, lambda: a @ b), args.repeats))
        )
    if not args.no_llama:
        from precguard.targets import build_tiny_llama, lm_batch

        torch.manual_seed(0)
        model = build_tiny_llama().eval()
        ids = lm_batch(0)["input_ids"]
        with torch.no_grad():
            rows.append(("tiny-llama fp32", best_ms(lambda: model(ids), args.repeats)))
            half = build_tiny_llama().eval().half()
            rows.append(("tiny-llama native fp16", best_ms(lambda: half(ids), args.repeats)))
            for profile in PROFILES:
                run = emulated(profile, lambda: model(ids))
                rows.append((f"tiny-llama emu:{profile}", best_ms(run, args.repeats)))
    width = max(len(name) for name, _ in rows)
    for name, ms in rows:
        print(f"{name.ljust(width)}  {ms:9.2f} ms")


if __name__ == "__main__":
    main()
