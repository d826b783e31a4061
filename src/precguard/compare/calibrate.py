"""A calibration pass in the spirit of TTrace (arXiv 2506.09280): the golden, perturbed.

``perturb_inputs(model, "bfloat16")`` makes every module's floating-point inputs
carry one unit roundoff of ``dtype`` of relative error (each element multiplied
by ``1 ± u``, the sign seeded per module and call), so a recording of the golden
code at the golden's precision with it shows each record's sensitivity to that
rounding. Pass that recording to ``compare --calibration``: a record's error
there raises its expected error where the analytic model is too low (an
ill-conditioned module). Run it at the golden's precision: the same code run at
the actual's precision would explain a precision bug of the code itself away.

>>> precguard.record_target("tiny-llama", out="runs/calibration", tensors=True,
...     prepare=lambda m: perturb_inputs(m, "bfloat16"))          # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from precguard.compare.tolerance import unit_roundoff


def perturb_inputs(
    model: nn.Module, dtype: str = "bfloat16", seed: int = 0
) -> list[RemovableHandle]:
    """Perturb every module's float inputs by one unit roundoff of ``dtype``; return the hooks.

    Each module call draws its signs from a generator seeded by ``seed``, the
    module's position in ``model.modules()`` and its call count, so two
    calibration passes agree.
    """
    u = unit_roundoff(dtype)
    handles = []
    for position, module in enumerate(model.modules()):
        calls = [0]

        def pre_hook(_mod: nn.Module, args: tuple[Any, ...], position: int = position,
                     calls: list[int] = calls) -> tuple[Any, ...]:  # fmt: skip
            gen = torch.Generator().manual_seed(seed * 1_000_003 + position * 1009 + calls[0])
            calls[0] += 1
            return tuple(_perturbed(a, u, gen) for a in args)

        handles.append(module.register_forward_pre_hook(pre_hook))
    return handles


def _perturbed(x: Any, u: float, gen: torch.Generator) -> Any:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return x
    signs = torch.randint(0, 2, x.shape, generator=gen).to(x.dtype).mul_(2).sub_(1)
    return x * (1 + u * signs.to(x.device))
