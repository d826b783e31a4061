"""A hand-written MLP under FSDP2 (``fully_shard``) on gloo, or whole in one process.

``python fsdp2_model.py OUT``: record one training step with full tensors into
OUT. Under torchrun every submodule and the root are ``fully_shard``-ed over all
ranks, and every rank is fed the same batch, so the averaged gradients are the
single-process gradients.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
from torch import nn


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.relu(self.fc1(x)))


def main() -> None:
    import precguard

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = MLP()
    if "WORLD_SIZE" in os.environ:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        dist.init_process_group("gloo")
        mesh = init_device_mesh("cpu", (dist.get_world_size(),))
        for module in (model.fc1, model.fc2, model):
            fully_shard(module, mesh=mesh)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    with precguard.monitor(model, out=sys.argv[1], tensors=True):
        model(x).square().mean().backward()
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo's threads can abort the interpreter's teardown ("terminate called without an
    # active exception", exit -6) after all the work is done: flush and leave without it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
