"""Where NaN/Inf first appears in one forward and backward: the watch the lab runs it under.

The device's unscaled backward (:meth:`precguard.checks._lab.Lab.gradients`)
runs once per checklist run under this watch, so ``grads.nonfinite_origin``
reads where a NaN/Inf was born from the same run that ``amp.loss_scaling``,
``amp.grad_clipping`` and ``grads.first_batch`` judge, instead of a forward and
backward of its own. The hooks return nothing: the run computes what it would
compute unwatched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precguard import tree
from precguard.capture.hooks import NonFiniteOrigin, has_nonfinite, on_calls, on_tensor_grad


@dataclass
class NonFiniteWatch:
    """What the watch saw: forward origins in call order, and each module's output gradient."""

    #: modules whose forward output held NaN/Inf while their inputs held none (first is the origin)
    forward_origin: list[str] = field(default_factory=list)
    #: (module, gradient of its output finite?) in the order the backward reached them
    backward_seen: list[tuple[str, bool]] = field(default_factory=list)


@contextlib.contextmanager
def watch_nonfinite(model: nn.Module) -> Iterator[NonFiniteWatch]:
    """Watch every module call of ``model`` (forward and the backward through its outputs).

    A hook that fails is an error of the run: it would call an unwatched run finite.
    """
    seen = NonFiniteWatch()
    origin = NonFiniteOrigin()

    def post(name: str, _m: nn.Module, args: Any, out: Any) -> None:
        if "forward" not in origin.found and origin.call(
            name, not has_nonfinite(args), not has_nonfinite(out)
        ):
            seen.forward_origin.append(name)
        t = tree.first_tensor(out, sort_keys=True)
        if t is not None and t.requires_grad:
            on_tensor_grad(
                t,
                lambda g, _q=name: seen.backward_seen.append((_q, bool(torch.isfinite(g).all()))),
                name=name,
                errors="raise",
            )

    with on_calls(model, post=post, modules=lambda _n, _m: True, with_kwargs=False, errors="raise"):
        yield seen
