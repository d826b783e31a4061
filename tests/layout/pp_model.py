"""A hand-written 2-stage pipeline: run whole in one process, or one stage per rank under torchrun.

Stage 0 holds the embedding and layers 0-1, stage 1 layers 2-3, the norm and the
head; activations go forward and their gradients back with ``send``/``recv`` on
gloo. Every stage builds the whole model from one seed and keeps its own
layers, under their global names (``layers.2`` stays ``layers.2`` on stage 1),
so the stages together compute the whole model's function.

``python pp_model.py OUT [--fault MODULE ...]``: record one training step with full
tensors into OUT; ``--fault`` scales MODULE's weight by 1.05 on the stage that
holds it.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn

VOCAB, HIDDEN, LAYERS, SEQ, BATCH = 64, 32, 4, 8, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, 2 * HIDDEN)
        self.fc2 = nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm(x))))


class PipeModel(nn.Module):
    """The layers of ``stage`` (of ``stages``); ``stages=1`` is the whole model."""

    def __init__(self, stage: int = 0, stages: int = 1) -> None:
        super().__init__()
        torch.manual_seed(0)
        embed = nn.Embedding(VOCAB, HIDDEN)
        layers = [Block() for _ in range(LAYERS)]
        norm, head = nn.LayerNorm(HIDDEN), nn.Linear(HIDDEN, VOCAB)
        per = LAYERS // stages
        self.first, self.last = stage == 0, stage == stages - 1
        if self.first:
            self.embed = embed
        self.layers = nn.ModuleDict(
            {str(i): layers[i] for i in range(stage * per, (stage + 1) * per)}
        )
        if self.last:
            self.norm, self.head = norm, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.first:
            x = self.embed(x)
        for layer in self.layers.values():
            x = layer(x)
        return self.head(self.norm(x)) if self.last else x


def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids and next-token labels."""
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    return ids[:, :-1], ids[:, 1:]


def main() -> None:
    import precguard

    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--fault", action="append", default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)
    stage, stages = 0, 1
    if "WORLD_SIZE" in os.environ:
        dist.init_process_group("gloo")
        stage, stages = dist.get_rank(), dist.get_world_size()
    model = PipeModel(stage, stages)
    held = dict(model.named_modules())
    for fault in args.fault:
        if fault in held:
            with torch.no_grad():
                held[fault].weight.mul_(1.05)
    ids, labels = batch()
    loss_of = torch.nn.functional.cross_entropy
    with precguard.monitor(model, out=args.out, tensors=True):
        if stages == 1:
            loss_of(model(ids).flatten(0, 1), labels.flatten()).backward()
        elif model.first:
            out = model(ids)
            dist.send(out.detach(), 1)
            grad = torch.empty_like(out)
            dist.recv(grad, 1)
            out.backward(grad)
        else:
            x = torch.empty(BATCH, SEQ, HIDDEN)
            dist.recv(x, 0)
            x.requires_grad_(True)
            loss_of(model(x).flatten(0, 1), labels.flatten()).backward()
            dist.send(x.grad, 0)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo's threads can abort the interpreter's teardown ("terminate called without an
    # active exception", exit -6) after all the work is done: flush and leave without it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
