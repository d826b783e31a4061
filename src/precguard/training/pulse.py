"""The scalars measured on every step, on the device, fetched in one transfer.

Per step the watch keeps, without a host sync per tensor:

* the loss (a 0-d tensor the user passes, or the ``loss`` of the model's
  output, caught by one forward hook on the root);
* each parameter's gradient norm, taken by a post-accumulate-grad hook when
  backward has finished accumulating it (before any clipping, so a NaN in
  one layer's gradient is seen in that layer, not smeared over every layer
  by ``clip_grad_norm_``); the global norm is their root sum of squares;
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
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from precguard._logging import get_logger
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

    @property
    def nonfinite(self) -> bool:
        """True when the loss, a gradient norm or an update ratio is NaN or Inf."""
        values = [self.loss, *self.grad_norms, *self.update_ratios]
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
        self._loss: torch.Tensor | None = None
        self._previous: torch.Tensor | None = None
        self._index = [self._sample_index(p) for _n, p in self.params]
        self._handles: list[RemovableHandle] = [
            p.register_post_accumulate_grad_hook(self._grad_hook(i))
            for i, (_n, p) in enumerate(self.params)
        ]
        self._handles.append(model.register_forward_hook(self._forward_hook))
        self._previous = self._sample()

    @staticmethod
    def _sample_index(p: torch.Tensor) -> torch.Tensor:
        n = p.numel()
        # evenly spread positions (with repeats for small tensors): the same every step
        return (torch.arange(SAMPLE, device=p.device) * max(n // SAMPLE, 1) + n // (2 * SAMPLE)) % n

    def _grad_hook(self, i: int) -> Any:
        norms = self._grad_norms

        def hook(p: torch.Tensor) -> None:
            try:
                with capture_scope():
                    norms[i] = torch.linalg.vector_norm(p.grad.detach(), dtype=torch.float32)
            except Exception as exc:  # never stop the backward pass
                logger.error("hook_failed", hook="watch_grad_norm", error=str(exc))

        return hook

    def _forward_hook(self, module: nn.Module, args: Any, output: Any) -> None:
        try:
            loss = loss_of(output)
            if loss is not None:
                self._loss = loss.detach()
        except Exception as exc:
            logger.error("hook_failed", hook="watch_loss", error=str(exc))

    def _sample(self) -> torch.Tensor | None:
        if not self.params:
            return None
        with torch.no_grad(), capture_scope():
            rows = [
                p.detach().reshape(-1)[idx].float()
                for (_n, p), idx in zip(self.params, self._index, strict=True)
            ]
            return torch.stack([r.to(rows[0].device) for r in rows])

    def collect(self, step: int, loss: torch.Tensor | float | None = None) -> StepScalars:
        """End ``step``: fetch its scalars (one transfer) and reset for the next step.

        ``loss``: the step's loss; default the loss the model's output carried.
        """
        if loss is None:
            loss = self._loss
        current = self._sample()
        parts: list[torch.Tensor] = []
        device = current.device if current is not None else torch.device("cpu")
        with torch.no_grad(), capture_scope():
            if isinstance(loss, torch.Tensor):
                parts.append(loss.detach().reshape(1).to(device, torch.float64))
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
        grad_norms = [next(it) if h else None for h in have]
        ratios: list[float | None] = [None] * n
        if current is not None and self._previous is not None:
            ratios = [None if r == -1.0 else r for r in (next(it) for _ in range(n))]
        present = [g for g in grad_norms if g is not None]
        grad_norm = math.sqrt(sum(g * g for g in present)) if present else None
        self._previous = current
        self._grad_norms[:] = [None] * n  # in place: the hooks hold this list
        self._loss = None
        return StepScalars(
            step=step,
            loss=float(loss_value) if loss_value is not None else None,
            grad_norm=grad_norm,
            grad_norms=grad_norms,
            update_ratios=ratios,
        )

    def remove(self) -> None:
        """Remove every hook (idempotent)."""
        for h in self._handles:
            h.remove()
        self._handles = []
