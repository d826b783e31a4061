"""Error of a device result against the fp64 oracle, and how it grows with sequence length.

One implementation for ``precguard op-check`` and the checklist's ``rope`` and
``ops`` checks: :func:`run_on_device` runs a function or module the way the
device runs it, :func:`op_errors` turns a result and its fp64 truth into the
numbers every report shows, :func:`fit_growth` fits how they grow.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from precguard.backend import Backend
from precguard.numerics import GROWTH_FACTOR, TOLERANCE_EPS, rope_allowed, ulp, unit_roundoff
from precguard.numerics import measure as measure_tensors
from precguard.oracle import map_tensors_keeping_types

_FROZEN = ConfigDict(frozen=True, ser_json_inf_nan="strings")

Numerics = Callable[[], contextlib.AbstractContextManager[Any]]

#: fp32 unit roundoff: what an angle rounded to fp32 costs per radian
FP32_UNIT = unit_roundoff("float32")


def cast_floats(value: Any, dtype: torch.dtype, device: torch.device | None = None) -> Any:
    """Cast every floating tensor of a nested value to ``dtype`` (and move all to ``device``)."""

    def cast(t: torch.Tensor) -> torch.Tensor:
        t = t.to(device) if device is not None else t
        return t.to(dtype) if t.is_floating_point() else t

    return map_tensors_keeping_types(value, cast)


def round_floats(value: Any, dtype: torch.dtype) -> Any:
    """Every floating tensor rounded to ``dtype`` and back (values the device can hold exactly).

    Device and oracle then start from the same inputs, so the error measured is
    the op's own, not the rounding of its inputs.
    """
    return map_tensors_keeping_types(
        value, lambda t: t.to(dtype).to(t.dtype) if t.is_floating_point() else t
    )


def run_on_device(
    fn: Callable[..., Any] | nn.Module,
    args: tuple,
    kwargs: dict | None = None,
    *,
    dtype: torch.dtype,
    device: torch.device,
    numerics: Numerics | None = None,
) -> Any:
    """Run ``fn`` (a private copy when it is a module) at ``dtype`` on ``device`` with ``numerics``.

    Floating arguments are cast to ``dtype``; the call runs without autograd.
    """
    if isinstance(fn, nn.Module):
        fn = copy.deepcopy(fn).to(device=device, dtype=dtype)
    a = cast_floats(args, dtype, device)
    k = cast_floats(kwargs or {}, dtype, device)
    with torch.no_grad(), numerics() if numerics else contextlib.nullcontext():
        return fn(*a, **k)


def float_leaves(value: Any) -> list[torch.Tensor]:
    """The floating tensors of a nested value, in order."""
    found: list[torch.Tensor] = []

    def keep(t: torch.Tensor) -> torch.Tensor:
        if t.is_floating_point():
            found.append(t)
        return t

    map_tensors_keeping_types(value, keep)
    return found


def flat64(value: Any) -> torch.Tensor:
    """Every floating tensor of a nested value, as one flat fp64 CPU tensor."""
    leaves = [t.detach().to("cpu", torch.float64).flatten() for t in float_leaves(value)]
    return torch.cat(leaves) if leaves else torch.zeros(0, dtype=torch.float64)


def probe_compute_dtype(backend: Backend) -> torch.dtype:
    """Find the precision the device computes fp32 arithmetic in, by experiment.

    Inside ``backend.numerics()``: ``1 + 2**-12`` survives only in fp32;
    ``1 + 2**-9`` survives in fp16 but not in bf16.
    """
    dev = backend.torch_device()
    one = torch.ones(4, device=dev)
    with backend.numerics(), torch.no_grad():
        fine = ((one + torch.full_like(one, 2.0**-12)) - one).abs().max().item()
        coarse = ((one + torch.full_like(one, 2.0**-9)) - one).abs().max().item()
    if fine > 0:
        return torch.float32
    return torch.float16 if coarse > 0 else torch.bfloat16


Status = Literal["pass", "fail", "nonfinite"]


def op_errors(got: Any, want: Any, dtype: torch.dtype) -> dict[str, float]:
    """Errors of ``got`` against the fp64 truth ``want`` (both nested; floating leaves compared).

    ``max_abs_err`` max|e|, ``mean_abs_err`` mean|e|, ``max_rel_err`` max|e| / max|truth|
    (relative to the output's scale: an element near zero does not blow it up),
    ``mean_rel_err`` mean|e| / mean|truth|, ``ulp_err`` max of |e| in units of
    ``dtype``'s spacing at the truth (:func:`precguard.numerics.measure`). A result
    non-finite where the truth is not (or the reverse) gives inf everywhere.
    """
    g, w = flat64(got), flat64(want)
    if g.shape != w.shape:
        raise ValueError(f"the device gave {g.numel()} values, the oracle {w.numel()}")
    if not g.numel():
        raise ValueError("no floating output to compare")
    m = measure_tensors(g, w, dtype)
    return {
        "max_abs_err": m.max_abs,
        "mean_abs_err": m.mean_abs,
        "max_rel_err": m.max_rel,
        "mean_rel_err": m.mean_rel,
        "ulp_err": m.ulps if m.ulps is not None else math.inf,
    }


class Growth(BaseModel):
    """How an error grows with sequence length: a log-log fit and a verdict."""

    model_config = _FROZEN

    metric: str = Field(description="The error fitted (mean_rel_err: it does not saturate).")
    slope: float = Field(description="d log(error) / d log(seq_len), least squares.")
    factor: float = Field(description="Fitted error growth from the shortest to the longest.")
    first: float = Field(description="Error at the shortest sequence length.")
    last: float = Field(description="Error at the longest sequence length.")
    verdict: Literal["flat", "grows", "nonfinite", "one point"] = Field(
        description=f"grows: fitted factor above {GROWTH_FACTOR:g}."
    )


def fit_growth(
    seq_lens: Sequence[int], errors: Sequence[float], floor: float, metric: str = "mean_rel_err"
) -> Growth:
    """Fit ``log(error) = a + slope * log(seq_len)``; errors below ``floor`` count as ``floor``.

    The floor (a fraction of the dtype's epsilon) keeps an error at the level
    of rounding noise from looking like growth.
    """
    first, last = (errors[0], errors[-1]) if errors else (0.0, 0.0)
    if any(not math.isfinite(e) for e in errors):
        return Growth(metric=metric, slope=math.inf, factor=math.inf, first=first, last=last,
                      verdict="nonfinite")  # fmt: skip
    if len(set(seq_lens)) < 2:
        return Growth(metric=metric, slope=0.0, factor=1.0, first=first, last=last,
                      verdict="one point")  # fmt: skip
    xs = [math.log(n) for n in seq_lens]
    ys = [math.log(max(e, floor)) for e in errors]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum(
        (x - mx) ** 2 for x in xs
    )
    factor = math.exp(slope * (max(xs) - min(xs)))
    verdict: Literal["flat", "grows"] = "grows" if factor > GROWTH_FACTOR else "flat"
    return Growth(metric=metric, slope=slope, factor=factor, first=first, last=last,
                  verdict=verdict)  # fmt: skip


__all__ = [
    "FP32_UNIT",
    "GROWTH_FACTOR",
    "TOLERANCE_EPS",
    "Growth",
    "cast_floats",
    "fit_growth",
    "flat64",
    "float_leaves",
    "op_errors",
    "probe_compute_dtype",
    "rope_allowed",
    "round_floats",
    "run_on_device",
    "ulp",
]
