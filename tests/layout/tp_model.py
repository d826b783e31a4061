"""A hand-written tensor-parallel transformer, run whole (one process) or 2-way under torchrun.

The same code runs both ways: with a tensor-parallel group of one it is the plain
model. Column-parallel linears (``q``, ``k``, ``v``, ``mlp.fc1``) hold the rows of
the whole weight that belong to their rank; row-parallel linears (``attn.out``,
``mlp.fc2``) hold its columns and return partial sums that the block all-reduces
(Megatron's ``f``/``g`` pair around each parallel region). Every rank builds the
whole weights from one seed and keeps its slices, so the parallel model computes
the whole model's function.

Run as a script (``python tp_model.py OUT [--fault MODULE]`` or under torchrun),
it records one training step with full tensors into OUT. ``--fault MODULE`` (repeatable)
scales the last rank's shard of that row-parallel module's weight by 1.05 before
recording: a fault in one rank's shard.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

VOCAB, HIDDEN, HEADS, FFN, LAYERS, SEQ, BATCH = 64, 32, 4, 64, 2, 8, 2


def _tp() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


class _CopyToParallel(torch.autograd.Function):
    """Identity forward; all-reduce of the gradient backward (Megatron's ``f``)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        if _tp()[1] > 1:
            grad = grad.contiguous()
            dist.all_reduce(grad)
        return grad


class _ReduceFromParallel(torch.autograd.Function):
    """All-reduce forward; identity backward (Megatron's ``g``)."""

    @staticmethod
    def forward(ctx, x):
        if _tp()[1] > 1:
            x = x.contiguous()
            dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Linear):
    """Rows ``rank/world`` of a whole ``nn.Linear``: the output is split along features."""

    def __init__(self, whole: nn.Linear) -> None:
        rank, world = _tp()
        rows = whole.out_features // world
        with torch.random.fork_rng():  # the whole weights alone draw from the seed
            super().__init__(whole.in_features, rows, bias=whole.bias is not None)
        with torch.no_grad():
            self.weight.copy_(whole.weight[rank * rows : (rank + 1) * rows])
            if whole.bias is not None:
                self.bias.copy_(whole.bias[rank * rows : (rank + 1) * rows])


class RowParallelLinear(nn.Linear):
    """Columns ``rank/world`` of a whole bias-free ``nn.Linear``: returns a partial sum."""

    def __init__(self, whole: nn.Linear) -> None:
        rank, world = _tp()
        cols = whole.in_features // world
        with torch.random.fork_rng():
            super().__init__(cols, whole.out_features, bias=False)
        with torch.no_grad():
            self.weight.copy_(whole.weight[:, rank * cols : (rank + 1) * cols])


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.heads = HEADS // _tp()[1]
        self.q = ColumnParallelLinear(nn.Linear(HIDDEN, HIDDEN))
        # no key bias: its gradient is zero in exact arithmetic (softmax ignores a shift)
        self.k = ColumnParallelLinear(nn.Linear(HIDDEN, HIDDEN, bias=False))
        self.v = ColumnParallelLinear(nn.Linear(HIDDEN, HIDDEN))
        self.out = RowParallelLinear(nn.Linear(HIDDEN, HIDDEN, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = _CopyToParallel.apply(x)
        b, s, _ = x.shape
        heads = (p(x).view(b, s, self.heads, -1).transpose(1, 2) for p in (self.q, self.k, self.v))
        q, k, v = heads
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        mask = torch.ones(s, s, dtype=torch.bool).triu(1)
        ctx = scores.masked_fill(mask, float("-inf")).softmax(-1) @ v
        return _ReduceFromParallel.apply(self.out(ctx.transpose(1, 2).reshape(b, s, -1)))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = ColumnParallelLinear(nn.Linear(HIDDEN, FFN))
        self.fc2 = RowParallelLinear(nn.Linear(FFN, HIDDEN, bias=False))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.nn.functional.gelu(self.fc1(_CopyToParallel.apply(x)))
        return _ReduceFromParallel.apply(self.fc2(h))


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(HIDDEN)
        self.attn = Attention()
        self.norm2 = nn.LayerNorm(HIDDEN)
        self.mlp = MLP()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TPModel(nn.Module):
    """Embedding, blocks, norm and head; the blocks are tensor-parallel."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.layers = nn.ModuleList(Block() for _ in range(LAYERS))
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def build() -> TPModel:
    """The model with the same whole weights on every rank (seeded)."""
    torch.manual_seed(0)
    return TPModel()


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token labels, the same on every rank."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def plant_fault(model: nn.Module, module: str, scale: float = 1.05) -> None:
    """Scale the last rank's shard of ``module``'s weight by ``scale``."""
    rank, world = _tp()
    if rank == world - 1:
        with torch.no_grad():
            model.get_submodule(module).weight.mul_(scale)


def main() -> None:
    import precguard

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--fault", action="append", default=[])
    parser.add_argument("--stats-only", action="store_true", help="save no full tensors")
    parser.add_argument("--fault-scale", type=float, default=1.05, help="the planted scale")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if "WORLD_SIZE" in __import__("os").environ:
        dist.init_process_group("gloo")
    model = build()
    for module in args.fault:
        plant_fault(model, module, args.fault_scale)
    ids, labels = batch()
    with precguard.monitor(model, out=args.out, tensors=not args.stats_only):
        logits = model(ids)
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten()).backward()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo's threads can abort the interpreter's teardown ("terminate called without an
    # active exception", exit -6) after all the work is done: flush and leave without it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
