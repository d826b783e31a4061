"""Run under torchrun: each rank records a DDP-wrapped tiny LLaMA into the same run."""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist

import precguard
from precguard.targets import build_tiny_llama, causal_lm_loss, lm_batch


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(build_tiny_llama())
    with precguard.monitor(model, out=sys.argv[1]):
        for step in range(2):
            batch = lm_batch(step, seed=rank)
            causal_lm_loss(model(**batch), batch).backward()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
    # gloo's threads can abort the interpreter's teardown ("terminate called without an
    # active exception", exit -6) after all the work is done: flush and leave without it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
