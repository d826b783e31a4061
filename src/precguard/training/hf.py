"""The watch as a ``transformers.Trainer`` callback.

>>> from precguard.training.hf import PrecguardWatchCallback          # doctest: +SKIP
>>> trainer = Trainer(model, args, train_dataset=ds,
...                   callbacks=[PrecguardWatchCallback("runs/watch", every=500)])

The watch opens at ``on_train_begin`` (with the Trainer's model and
optimizer), ends each step at ``on_step_end`` (after the optimizer step, as
:meth:`WatchHandle.step` expects) and closes at ``on_train_end``. The loss is
the ``loss`` of the model's output, caught by a forward hook: with gradient
accumulation, the last micro-batch's. Gradient norms are taken as backward
accumulates them, so they are the norms before the Trainer clips them. The
Trainer computes the global norm itself (to clip, or to log it) but passes it
to no callback, so the watch cannot be handed it (``WatchHandle.step``'s
``grad_norm``) and makes its own pass over the gradients each step.
Only the process with ``state.is_world_process_zero`` writes (and watches).
"""

from __future__ import annotations

import os
from typing import Any

from transformers import TrainerCallback

from precguard.training.handle import WatchHandle, watch


class PrecguardWatchCallback(TrainerCallback):  # type: ignore[misc]
    """Run :func:`precguard.watch` over a ``Trainer``'s training loop."""

    def __init__(
        self,
        out: str | os.PathLike[str] | None,
        *,
        every: int = 1000,
        overwrite: bool = False,
        **options: Any,
    ) -> None:
        self.out = out
        self.every = every
        self.overwrite = overwrite
        self.options = options
        #: the open watch while training runs (and the last one after)
        self.handle: WatchHandle | None = None

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Open the watch on the Trainer's model and optimizer."""
        if not state.is_world_process_zero:
            return
        self.handle = watch(
            kwargs["model"],
            kwargs.get("optimizer"),
            every=self.every,
            out=self.out,
            overwrite=self.overwrite,
            **self.options,
        )

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """End the watch's step (the optimizer has stepped)."""
        if self.handle is None or self.handle.closed:
            return
        if self.handle.optimizer is None:
            self.handle.optimizer = kwargs.get("optimizer")
        self.handle.step()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Close the watch: hooks off, files finished."""
        if self.handle is not None:
            self.handle.remove()
