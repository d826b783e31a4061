"""How many probes ``precguard bisect`` needs: O(k log L) for k culprits among L blocks.

Builds hand-written decoders of L residual blocks (norm + MLP) in which k
blocks have a norm that overflows in fp16, bisects each on ``emu:fp16``
against the CPU in fp32, and prints the probe count (every forward on the
device, the baseline included) for every placement of the culprits tried,
next to L (what trying each block alone would cost).

    python benchmarks/bisect_probes.py [--blocks 4 16] [--device emu:fp16]
"""

from __future__ import annotations

import argparse
import itertools

import torch
from torch import nn

import precguard
from precguard.localize.bisect import bisect

HIDDEN = 32


class Norm(nn.Module):
    """RMS norm; ``scale`` 100 makes its squares overflow fp16 (the same math in fp32)."""

    def __init__(self, scale: float) -> None:
        super().__init__()
        self.scale = scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x * self.scale
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)


class Block(nn.Module):
    def __init__(self, fragile: bool) -> None:
        super().__init__()
        self.norm = Norm(100.0 if fragile else 1.0)
        self.mlp = nn.Sequential(nn.Linear(HIDDEN, 64), nn.GELU(), nn.Linear(64, HIDDEN))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.norm(x))


class Decoder(nn.Module):
    def __init__(self, blocks: int, fragile: tuple[int, ...]) -> None:
        super().__init__()
        self.embed = nn.Linear(16, HIDDEN)
        self.blocks = nn.ModuleList(Block(i in fragile) for i in range(blocks))
        self.head = nn.Linear(HIDDEN, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x) * 4
        for block in self.blocks:
            h = block(h)
        return self.head(h)


def target(blocks: int, fragile: tuple[int, ...]) -> precguard.Target:
    return precguard.Target(
        model=lambda: Decoder(blocks, fragile),
        batch=lambda step: torch.randn(2, 6, 16, generator=torch.Generator().manual_seed(step)),
        name=f"decoder{blocks}{list(fragile)}",
    )


def placements(blocks: int, k: int) -> list[tuple[int, ...]]:
    """A few spread-out placements of ``k`` culprits among ``blocks`` (first, middle, last)."""
    spots = sorted({0, blocks // 3, blocks // 2, (2 * blocks) // 3, blocks - 1})
    return [c for c in itertools.combinations(spots, k)][:6]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[4, 16])
    parser.add_argument("--device", default="emu:fp16")
    args = parser.parse_args()
    print(f"{'blocks':>6} {'k':>2} {'culprit blocks':>16} {'probes':>6}  found")
    for blocks in args.blocks:
        for k in (0, 1, 2):
            for fragile in placements(blocks, k) if k else [()]:
                result = bisect(target(blocks, fragile), device=args.device)
                expected = [f"blocks.{i}.norm" for i in fragile]
                ok = "ok" if result.culprits == expected else f"MISMATCH {result.culprits}"
                print(f"{blocks:>6} {k:>2} {list(fragile)!s:>16} {result.probe_count:>6}  {ok}")


if __name__ == "__main__":
    main()
