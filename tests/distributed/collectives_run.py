"""Run under torchrun (gloo, CPU): a hand-written data-parallel MLP that all-reduces by hand.

``python -m torch.distributed.run --nproc_per_node=2 collectives_run.py OUT SCENARIO``

Scenarios, each what a user's training script would do:

* ``clean``: two steps, gradients averaged with ``dist.all_reduce``; replicas agree.
* ``nan``: rank 1's hidden layer produces NaN in step 0, before the all-reduce of the
  activations' sum that every rank shares.
* ``drift``: DDP; after backward, rank 1's copy of one gradient is scaled by 1.001 before
  the optimizer step (a rank-local gradient bug), so its parameters drift in step 1.
* ``die``: rank 1 is SIGKILLed before it closes its recording; rank 0 completes.

Exit 2 with one line on stderr on a PrecguardError (the refused output directory), as
precguard's own CLI does.
"""

from __future__ import annotations

import os
import signal
import sys

import torch
import torch.distributed as dist
from torch import nn

import precguard
from precguard import PrecguardError


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(8, 16)
        self.act = nn.GELU()
        self.down = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class Poison(nn.Module):
    """Turns its input into NaN on one rank (a device fault planted for the test)."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if dist.get_rank() == self.rank:
            return x * float("nan")
        return x * 1.0


class Net(nn.Module):
    def __init__(self, poison_rank: int | None) -> None:
        super().__init__()
        self.mlp = MLP()
        self.poison = Poison(poison_rank if poison_rank is not None else -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.poison(self.mlp(x))
        total = h.detach().sum(dim=0, keepdim=True)
        dist.all_reduce(total)  # a statistic every rank shares (as a loss scale would be)
        return h - total / (dist.get_world_size() * h.shape[0])


def train_step(net: nn.Module, opt: torch.optim.Optimizer, scenario: str, step: int) -> None:
    rank = dist.get_rank()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(100 * rank + step))
    net(x).square().mean().backward()
    if scenario != "drift":
        for p in net.parameters():
            work = dist.all_reduce(p.grad, async_op=True)  # as overlapping code would
            work.wait()
            p.grad /= dist.get_world_size()
    elif rank == 1:
        net.module.mlp.down.weight.grad.mul_(1.001)
    opt.step()
    opt.zero_grad()


def build(scenario: str) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    net: nn.Module = Net(1 if scenario == "nan" else None)
    if scenario == "drift":
        net = nn.parallel.DistributedDataParallel(net)
    return net, torch.optim.SGD(net.parameters(), lr=0.1)


def main() -> None:
    out, scenario = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    net, opt = build(scenario)
    original = dist.all_reduce
    try:
        with precguard.monitor(net, out=out, params="every_step") as mon:
            for step in range(2):
                train_step(net, opt, scenario, step)
                mon.step()
            if scenario == "die" and rank == 1:
                dist.barrier()  # rank 0 has closed its recording
                os.kill(os.getpid(), signal.SIGKILL)
    except PrecguardError as exc:
        sys.stderr.write(f"precguard: error: {exc}\n")  # one write: ranks share stderr
        sys.stderr.flush()
        os._exit(exc.exit_code)  # not through gloo's teardown, which can abort with -6
    if scenario == "die":
        dist.barrier()  # rank 1 dies right after it: nothing more to do with it
        return
    if dist.all_reduce is not original:
        sys.exit("a collective stayed patched after the recording")
    # the same training without precguard: every parameter bit for bit the same (NaN too)
    plain, plain_opt = build(scenario)
    for step in range(2):
        train_step(plain, plain_opt, scenario, step)
    for (name, a), b in zip(net.named_parameters(), plain.parameters(), strict=True):
        if not torch.equal(a.detach().view(torch.int32), b.detach().view(torch.int32)):
            sys.exit(f"recording changed what the model computes: {name}")
    dist.barrier()  # no rank tears the group down while the other still talks to it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo's threads can abort the interpreter's teardown ("terminate called without an
    # active exception", exit -6) after all the work is done: flush and leave without it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
