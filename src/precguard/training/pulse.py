"""The scalars measured on every step, on the device, fetched in one transfer.

Per step the watch keeps, without a host sync per tensor:

* the loss (a 0-d tensor the user passes, or the ``loss`` of the model's
  output, caught by one forward hook on the root);
* the global gradient norm: the one the training loop's clipping already
  computed when :meth:`Pulse.collect` is given it (``clip_grad_norm_``
  returns it), else the root sum of squares of each parameter's gradient
  norm, taken by a post-accumulate-grad hook when backward has finished
  accumulating it (before any clipping, so a NaN in one layer's gradient is
  seen in that layer, not smeared over every layer by ``clip_grad_norm_``).
  Those hooks are the watch's one pass over the gradients, a memory-bound
  read of every gradient; :attr:`Pulse.layer_grads` switches them off when
  the loop hands its norm over (the handle does it between recorded steps);
* each parameter's update/param ratio ``||p_t - p_{t-1}|| / ||p_{t-1}||``,
  estimated on a fixed sample of :data:`SAMPLE` elements per parameter
  (the same positions every step), so no copy of the parameters is kept
  between steps. An estimate: for Adam-type updates, whose elements have
  similar magnitudes, it is within a few percent of the exact ratio; sampled
  steps record the exact one.

:meth:`Pulse.collect` stacks everything into one float64 vector and fetches it
with one ``tolist()``: one transfer per step, whatever the number of layers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import torch
from torch import nn

from precguard._logging import get_logger
from precguard.capture.hooks import HookHandle, on_calls, on_param_grads
from precguard.capture.stats import capture_scope

logger = get_logger(__name__)

#: elements per parameter in the update-ratio sample
SAMPLE = 256


@dataclass(frozen=True)
class StepScalars:
    """What one step measured, on the host."""

    step: int
    loss: float | None
    grad_norm: float | None
    #: per parameter, in :attr:`Pulse.names` order; None where it had no gradient
    grad_norms: list[float | None]
    #: per parameter; None where the parameter's sample was all zero before the step
    update_ratios: list[float | None]
    #: indices (in :attr:`Pulse.names` order) of the parameters holding a NaN/Inf after
    #: the update, found by :meth:`Pulse.nonfinite_params` on a step whose per-layer
    #: numbers named no layer (the global norm came from the loop); else empty
    nonfinite_params: tuple[int, ...] = ()

    @cached_property
    def nonfinite(self) -> bool:
        """True when the loss, the global or a layer's gradient norm, or an update is NaN/Inf."""
        values = [self.loss, self.grad_norm, *self.grad_norms, *self.update_ratios]
        return any(v is not None and not math.isfinite(v) for v in values)

    @cached_property
    def names_a_layer(self) -> bool:
        """True when a per-layer number (gradient norm, update ratio) is itself non-finite."""
        values = [*self.grad_norms, *self.update_ratios]
        return any(v is not None and not math.isfinite(v) for v in values)


def loss_of(output: Any) -> torch.Tensor | None:
    """The ``loss`` of a model's output (an HF ``ModelOutput``, a dict), if it has one."""
    loss = output.get("loss") if isinstance(output, dict) else getattr(output, "loss", None)
    return loss if isinstance(loss, torch.Tensor) and loss.numel() == 1 else None


class Pulse:
    """The every-step measurements of one model: hooks, samples and one fetch per step."""

    def __init__(self, model: nn.Module) -> None:
        self.params: list[tuple[str, nn.Parameter]] = [
            (name, p) for name, p in model.named_parameters() if p.requires_grad
        ]
        #: qualified parameter names, the layers alerts name
        self.names = [name for name, _p in self.params]
        self._grad_norms: list[torch.Tensor | None] = [None] * len(self.params)
        #: whether the gradient hooks take each parameter's norm (the one pass over the
        #: gradients); off, backward runs them as bare Python calls that return at once
        self.layer_grads = True
        self._loss: torch.Tensor | None = None
        self._previous: torch.Tensor | None = None
        self._index = [self._sample_index(p) for _n, p in self.params]
        self._uniform = len({(p.dtype, p.device) for _n, p in self.params}) <= 1
        position = {name: i for i, name in enumerate(self.names)}
        # a failing hook reports itself (hook_failed) and never stops the step
        self._handles: list[HookHandle] = [
            on_param_grads(self.params, lambda name, p: self._grad_norm(position[name], p)),
            on_calls(model, post=self._forward_hook, modules=["root"], with_kwargs=False),
        ]
        self._previous = self._sample()

    @staticmethod
    def _sample_index(p: torch.Tensor) -> tuple[int, int] | torch.Tensor:
        """Where ``p`` is sampled: the same evenly spread positions every step.

        ``(stride, offset)`` of a strided view for a contiguous parameter of at
        least :data:`SAMPLE` elements (no gather kernel: one ``stack`` copies
        every parameter's view); else an index tensor, with repeats for small tensors.
        """
        n = p.numel()
        stride, offset = max(n // SAMPLE, 1), n // (2 * SAMPLE)
        if n >= SAMPLE and p.is_contiguous():
            return stride, offset
        return (torch.arange(SAMPLE, device=p.device) * stride + offset) % n

    def _grad_norm(self, i: int, p: torch.Tensor) -> None:
        if not self.layer_grads:
            return
        with capture_scope():
            self._grad_norms[i] = torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32)

    def _forward_hook(self, _name: str, module: nn.Module, args: Any, output: Any) -> None:
        loss = loss_of(output)
        if loss is not None:
            self._loss = loss.detach()

    def _sample(self) -> torch.Tensor | None:
        if not self.params:
            return None
        with torch.no_grad(), capture_scope():
            rows = [
                p.detach().as_strided((SAMPLE,), (idx[0],), p.storage_offset() + idx[1])
                if isinstance(idx, tuple)
                else p.detach().reshape(-1)[idx]
                for (_n, p), idx in zip(self.params, self._index, strict=True)
            ]
            if self._uniform:  # one dtype, one device: one copy, one conversion
                return torch.stack(rows).float()
            return torch.stack([r.float().to(rows[0].device) for r in rows])

    def nonfinite_params(self) -> tuple[int, ...]:
        """Indices of the parameters holding a NaN or Inf now: one pass over every parameter.

        For the step a non-finite global norm comes from the loop with no per-layer
        number to name the layer: the optimizer carried the NaN into the parameters
        it reached (all of them when ``clip_grad_norm_`` scaled every gradient by NaN).
        """
        with torch.no_grad(), capture_scope():
            flags = [torch.isfinite(p.detach()).all() for _n, p in self.params]
            if not flags:
                return ()
            finite = torch.stack([f.to(flags[0].device) for f in flags]).tolist()
        return tuple(i for i, ok in enumerate(finite) if not ok)

    def collect(
        self,
        step: int,
        loss: torch.Tensor | float | None = None,
        grad_norm: torch.Tensor | float | None = None,
    ) -> StepScalars:
        """End ``step``: fetch its scalars (one transfer) and reset for the next step.

        ``loss``: the step's loss; default the loss the model's output carried.
        ``grad_norm``: the step's global gradient norm as the loop computed it
        (``clip_grad_norm_``'s result, before clipping); default the root sum of
        squares of the per-parameter norms the hooks took.
        """
        if loss is None:
            loss = self._loss
        current = self._sample()
        parts: list[torch.Tensor] = []
        device = current.device if current is not None else torch.device("cpu")
        with torch.no_grad(), capture_scope():
            if isinstance(loss, torch.Tensor):
                parts.append(loss.detach().reshape(1).to(device, torch.float64))
            if isinstance(grad_norm, torch.Tensor):
                parts.append(grad_norm.detach().reshape(1).to(device, torch.float64))
            n = len(self.params)
            have = [g is not None for g in self._grad_norms]
            if any(have):
                norms = [g.to(device) for g in self._grad_norms if g is not None]
                parts.append(torch.stack(norms).double())
            if current is not None and self._previous is not None:
                delta = torch.linalg.vector_norm(current - self._previous, dim=1)
                base = torch.linalg.vector_norm(self._previous, dim=1)
                # a parameter sampled at zero (a zero-initialised bias) has no ratio: -1
                ratio = torch.where(base == 0, -1.0, delta / base)
                parts.append(ratio.double())
            values = torch.cat(parts).tolist() if parts else []  # the one transfer
        it = iter(values)
        loss_value = next(it) if isinstance(loss, torch.Tensor) else loss
        given = next(it) if isinstance(grad_norm, torch.Tensor) else grad_norm
        grad_norms = [next(it) if h else None for h in have]
        ratios: list[float | None] = [None] * n
        if current is not None and self._previous is not None:
            ratios = [None if r == -1.0 else r for r in (next(it) for _ in range(n))]
        present = [g for g in grad_norms if g is not None]
        if given is not None:
            global_norm: float | None = float(given)
        else:
            global_norm = math.sqrt(sum(g * g for g in present)) if present else None
        self._previous = current
        self._grad_norms[:] = [None] * n  # in place: the hooks hold this list
        self._loss = None
        return StepScalars(
            step=step,
            loss=float(loss_value) if loss_value is not None else None,
            grad_norm=global_norm,
            grad_norms=grad_norms,
            update_ratios=ratios,
        )

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles = []
