"""A calibration pass in the spirit of TTrace (arXiv 2506.09280): the golden, perturbed.

A recording of the golden code at the golden's precision with :func:`perturb_inputs`
shows each record's sensitivity to one rounding; ``compare --calibration`` raises each
record's expected error to it (docs/compare.md, "Calibrating on the model (TTrace)").

>>> precguard.record_target("tiny-llama", out="runs/calibration", tensors=True,
...     prepare=lambda m: perturb_inputs(m, "bfloat16"))          # doctest: +SKIP
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from precguard.capture.hooks import HookHandle, on_calls
from precguard.compare.tolerance import unit_roundoff


def perturb_inputs(model: nn.Module, dtype: str = "bfloat16", seed: int = 0) -> HookHandle:
    """Perturb every module's float inputs by one unit roundoff of ``dtype``; return the hooks.

    Each module call draws its signs from a generator seeded by ``seed``, the
    module's position in ``model.modules()`` and its call count, so two
    calibration passes agree. ``remove()`` the handle (or use it as a context
    manager) to compute as before.
    """
    u = unit_roundoff(dtype)
    position = {mod: i for i, mod in enumerate(model.modules())}
    calls: dict[str, int] = {}

    def pre(name: str, module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...]:
        call = calls.get(name, 0)
        calls[name] = call + 1
        gen = torch.Generator().manual_seed(seed * 1_000_003 + position[module] * 1009 + call)
        return tuple(_perturbed(a, u, gen) for a in args)

    # a perturbation that failed would calibrate on unperturbed inputs: raised, not reported
    return on_calls(model, pre, modules=lambda _n, _m: True, with_kwargs=False, errors="raise")


def _perturbed(x: Any, u: float, gen: torch.Generator) -> Any:
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return x
    signs = torch.randint(0, 2, x.shape, generator=gen).to(x.dtype).mul_(2).sub_(1)
    return x * (1 + u * signs.to(x.device))
