"""FP8 GEMMs as the emulator runs them: scaled operands rounded to e4m3/e5m2, fp32 sums.

A Linear layer on an fp8 chip (Transformer Engine on Hopper, DeepSeek-V3's
recipe) multiplies two operands that were each divided by a *scale*, rounded
to the 8-bit format with saturation, and multiplies the fp32 sum back by the
product of the scales. What differs between recipes is where a scale comes
from:

- ``current``: per tensor, from this step's amax (``scale = amax / fmax``);
- ``delayed``: per tensor, from the largest amax of the last ``history`` calls of
  the same GEMM (Transformer Engine's amax history); the first call, with no
  history, uses its own amax. Elements above ``fmax * scale`` saturate;
- ``block``: one scale per 1 x ``block`` tile of the activation (along the reduced
  dimension) and per ``block`` x ``block`` tile of the weight (DeepSeek-V3).

``scale_rounding = "pow2"`` rounds each scale up to a power of two (the E8M0
scales of the OCP MX formats), which keeps the rounding of the values the same
and gives up at most one binade of range. Everything here takes and returns
float32 tensors whose *values* are what the chip computed.
"""

from __future__ import annotations

import contextlib
import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from precguard import numerics

#: the emulated fp8 formats by profile name: torch dtype
FORMATS: dict[str, torch.dtype] = {
    "e4m3": torch.float8_e4m3fn,
    "e5m2": torch.float8_e5m2,
}


@dataclass(frozen=True)
class Fp8Recipe:
    """How one profile runs its GEMMs in fp8."""

    format: str = "e4m3"
    scaling: str = "current"  # current | delayed | block
    history: int = 16
    block: int = 128
    scale_rounding: str = "exact"  # exact | pow2

    @property
    def dtype(self) -> torch.dtype:
        """The torch float8 dtype of the operands."""
        return FORMATS[self.format]

    @property
    def dtype_name(self) -> str:
        """The dtype's name as records spell it (``float8_e4m3fn``)."""
        return str(self.dtype).removeprefix("torch.")


@dataclass
class AmaxHistory:
    """The amax of the last ``length`` calls of each GEMM operand, by site (delayed scaling)."""

    length: int
    seen: dict[tuple[int, int], deque[float]] = field(default_factory=dict)

    def scale_amax(self, site: tuple[int, int], amax: float) -> float:
        """The amax the scale of this call is made from; then remember this call's amax."""
        past = self.seen.setdefault(site, deque(maxlen=self.length))
        used = max(past) if past else amax
        past.append(amax)
        return used


def fmax(dtype: torch.dtype) -> float:
    """The largest finite value of an fp8 dtype (448 for e4m3fn, 57344 for e5m2)."""
    return float(torch.finfo(dtype).max)


def scale_of(amax: torch.Tensor, dtype: torch.dtype, rounding: str = "exact") -> torch.Tensor:
    """``amax / fmax`` (elementwise over block amaxes); 1 where amax is 0; pow2 rounds up."""
    scale = amax / fmax(dtype)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    if rounding == "pow2":
        scale = torch.exp2(torch.ceil(torch.log2(scale)))
    return scale


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` divided by ``scale``, rounded to ``dtype`` with saturation, times ``scale``.

    ``scale`` broadcasts against ``x``. Values beyond the format's range clamp to
    its ±max (what fp8 GEMM recipes do: an overflow is a saturation, never an inf).
    """
    top = fmax(dtype)
    q = (x / scale).clamp(-top, top).to(dtype).to(torch.float32)
    return q * scale


def _tile_amax(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """Amax of each ``rows`` x ``cols`` tile of the last two dims, expanded back to ``x``."""
    *lead, m, n = x.shape
    pm, pn = (-m) % rows, (-n) % cols
    a = torch.nn.functional.pad(x.abs(), (0, pn, 0, pm))
    t = a.reshape(*lead, (m + pm) // rows, rows, (n + pn) // cols, cols)
    amax = t.amax(dim=(-3, -1), keepdim=True).expand_as(t)
    return amax.reshape(*lead, m + pm, n + pn)[..., :m, :n]


def activation_scales(x: torch.Tensor, recipe: Fp8Recipe) -> torch.Tensor:
    """Block scales of an activation ``(..., M, K)``: one per 1 x block tile along K."""
    return scale_of(_tile_amax(x, 1, recipe.block), recipe.dtype, recipe.scale_rounding)


def weight_scales(w: torch.Tensor, recipe: Fp8Recipe) -> torch.Tensor:
    """Block scales of a weight operand ``(K, N)``: one per block x block tile."""
    return scale_of(_tile_amax(w, recipe.block, recipe.block), recipe.dtype, recipe.scale_rounding)


def tensor_scale(
    x: torch.Tensor, recipe: Fp8Recipe, history: AmaxHistory | None, site: tuple[int, int]
) -> torch.Tensor:
    """The per-tensor scale of ``x``: its own amax, or the amax history's (delayed)."""
    amax = float(x.abs().amax()) if x.numel() else 0.0
    if recipe.scaling == "delayed" and history is not None and math.isfinite(amax):
        amax = history.scale_amax(site, amax)
    return scale_of(torch.tensor(amax), recipe.dtype, recipe.scale_rounding)


def site_of(t: torch.Tensor) -> int:
    """A GEMM operand's site: the storage it views (a Linear's weight, whatever its view)."""
    return t.untyped_storage().data_ptr()


def operand_scales(
    a: torch.Tensor,
    b: torch.Tensor,
    recipe: Fp8Recipe,
    history: AmaxHistory | None = None,
    *,
    site: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The scales of both operands of ``a @ b`` (a: ``(M, K)``, b: ``(K, N)``), each
    broadcastable against its operand.

    ``a`` is the activation (1 x block tiles along K under block scaling), ``b`` the
    weight (block x block tiles). Delayed scaling keys the history by ``site`` (default:
    ``b``'s storage), so each Linear keeps its own amax history for both operands.
    """
    if recipe.scaling == "block":
        return activation_scales(a, recipe), weight_scales(b, recipe)
    site = site_of(b) if site is None else site
    return (
        tensor_scale(a, recipe, history, (site, 0)),
        tensor_scale(b, recipe, history, (site, 1)),
    )


class Fp8Log:
    """Per-GEMM operand statistics, collected while :func:`collect` is active."""

    def __init__(self) -> None:
        self.entries: list[dict] | None = None


#: the collector the emulator appends to (None: not collecting, nothing computed)
LOG = Fp8Log()


@contextlib.contextmanager
def collect() -> Iterator[list[dict]]:
    """Collect each fp8 GEMM's operand statistics (:func:`operand_statistics`) run inside.

    Each entry: ``{"site": int, "operands": [activation stats, weight stats]}``; the
    ``fp8`` checks name a GEMM by its weight's storage (``site``).
    """
    before, LOG.entries = LOG.entries, []
    try:
        yield LOG.entries
    finally:
        LOG.entries = before


def operand_statistics(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> dict:
    """Saturated and underflowed shares, amax and scale of ``x`` quantized with ``scale``.

    Saturated: ``|x| / scale`` beyond what rounding carries to the format's max
    (:func:`~precguard.numerics.fp8_saturation_bound`: the clamp, not the rounding,
    sets its value); underflowed: a nonzero ``x`` that rounds to zero. The ``fp8``
    checks read these.
    """
    y = x / scale
    n = max(x.numel(), 1)
    nonzero = x != 0
    flushed = nonzero & (y.to(dtype).to(torch.float32) == 0)
    amax = float(x.abs().amax()) if x.numel() else 0.0
    return {
        "numel": x.numel(),
        "saturated": float((y.abs() > numerics.fp8_saturation_bound(dtype)).sum()) / n,
        "underflow": float(flushed.sum()) / n,
        "amax": amax,
        "scale": float(scale.max()),
        # the amax the scale stands for over the operand's own (below 1: a stale scale)
        "scale_amax_ratio": float(scale.max()) * fmax(dtype) / amax if amax > 0 else 1.0,
    }


__all__ = [
    "FORMATS",
    "LOG",
    "AmaxHistory",
    "Fp8Recipe",
    "activation_scales",
    "collect",
    "fmax",
    "operand_scales",
    "operand_statistics",
    "quantize",
    "scale_of",
    "site_of",
    "tensor_scale",
    "weight_scales",
]
