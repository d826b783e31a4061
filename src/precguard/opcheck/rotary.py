"""Rotary embeddings swept over positions: the HF convention ``forward(x, position_ids)``.

A rotary module that returns ``(cos, sin)`` for ``position_ids`` can be asked
for any positions, far beyond a short captured batch. These helpers call it
on the device and under the fp64 oracle and measure the error per position;
``op-check --module`` and the checklist's ``rope`` checks both use them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from precguard.opcheck.measure import Numerics, cast_floats
from precguard.oracle import run_in_fp64


class NotRotary(ValueError):
    """The module does not follow ``forward(x, position_ids) -> (cos, sin)``."""


def looks_rotary(module: nn.Module) -> bool:
    """True for a module whose class name says rotary or RoPE."""
    cls = type(module).__name__.lower()
    return "rotary" in cls or "rope" in cls


def call_rotary(mod: nn.Module, x: torch.Tensor, positions: torch.Tensor, kwargs: dict) -> Any:
    """``mod(x, positions)``, or with ``position_ids=`` when the captured call passed it so."""
    if "position_ids" in kwargs:
        return mod(x, **{**kwargs, "position_ids": positions})
    return mod(x, positions)


def positions_like(args: tuple, kwargs: dict, n: int) -> torch.Tensor:
    """Positions 0..n-1 shaped as the captured call's were: ``[n]`` for a module called with
    1-D positions, ``[1, n]`` (HF's ``position_ids``) otherwise."""
    captured = kwargs.get("position_ids", args[1] if len(args) > 1 else None)
    if isinstance(captured, torch.Tensor) and captured.dim() == 1:
        return torch.arange(n)
    return torch.arange(n)[None, :]


def cos_sin(out: Any, name: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``(cos, sin)`` pair a rotary module returned, or :class:`NotRotary`."""
    if (
        isinstance(out, tuple | list)
        and len(out) >= 2
        and all(isinstance(t, torch.Tensor) for t in out[:2])
    ):
        return out[0], out[1]
    raise NotRotary(
        f"{name} does not follow forward(x, position_ids) -> (cos, sin); "
        f"it returned {type(out).__name__}"
    )


def first_input(name: str, args: tuple, kwargs: dict) -> torch.Tensor:
    """The tensor a rotary module was called with (its dtype and device matter)."""
    x = args[0] if args else kwargs.get("x")
    if not isinstance(x, torch.Tensor):
        raise NotRotary(f"{name} was not called with a tensor first argument")
    return x


def rotary_oracle(
    name: str, mod: nn.Module, x: torch.Tensor, positions: torch.Tensor, kwargs: dict
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of ``positions`` under the fp64 oracle (the module's own casts widened too)."""
    return cos_sin(run_in_fp64(call_rotary, x, positions, kwargs, module=mod), name)


def rotary_on(
    name: str,
    mod: nn.Module,
    x: torch.Tensor,
    positions: torch.Tensor,
    kwargs: dict,
    *,
    dtype: torch.dtype,
    device: torch.device,
    numerics: Numerics,
) -> tuple[nn.Module, tuple[torch.Tensor, torch.Tensor]]:
    """cos/sin of ``positions`` from a copy of ``mod`` at ``dtype`` on ``device`` (and the copy)."""
    import copy

    m = copy.deepcopy(mod).to(device=device, dtype=dtype)
    with torch.no_grad(), numerics():
        out = call_rotary(
            m,
            cast_floats(x, dtype, device),
            positions.to(device),
            cast_floats(kwargs, dtype, device),
        )
    return m, cos_sin(out, name)


def per_position_error(
    got: tuple[torch.Tensor, torch.Tensor], want: tuple[torch.Tensor, torch.Tensor], n: int
) -> torch.Tensor:
    """Largest |error| of cos and sin at each of ``n`` positions (non-finite counts as inf)."""
    cos, sin = got
    err = torch.maximum(
        (cos.detach().cpu().double() - want[0]).abs(), (sin.detach().cpu().double() - want[1]).abs()
    )
    err = torch.nan_to_num(err, nan=float("inf"))
    return err.reshape(-1, n, err.shape[-1]).amax(dim=(0, 2))
