"""The one handle protocol of every way to record: ``step()``, ``remove()``, ``with``.

:func:`precguard.monitor`, :func:`precguard.recording` and :func:`precguard.watch`
each return a :class:`Handle` (op capture is ``monitor(..., level="op")``: the same
handle; ``@precision_monitor`` objects write into the open ``recording``). As torch's
``RemovableHandle``: removing twice is harmless, and the handle is a context manager
that removes at the end of the block, also when the block raises (the recording then
says ``complete: false`` and names the exception, which propagates).
"""

from __future__ import annotations

from typing import Any, TypeVar

H = TypeVar("H", bound="Handle")


class Handle:
    """What every way to record returns: ``step()``, ``remove()`` and context-manager use.

    >>> with precguard.monitor(model, out="runs/cpu") as handle:   # doctest: +SKIP
    ...     for batch in batches:
    ...         model(batch)
    ...         handle.step()
    """

    def step(self, *args: Any, **kwargs: Any) -> None:
        """End the current step; what is captured next belongs to the next one."""
        raise NotImplementedError

    def remove(self, error: BaseException | None = None) -> None:
        """Remove every hook and close what was recorded. Idempotent.

        ``error``: the exception that ended the recorded code, if any; the
        recording then says ``complete: false`` and names it (``with`` passes it).
        """
        raise NotImplementedError

    def __enter__(self: H) -> H:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.remove(exc)
