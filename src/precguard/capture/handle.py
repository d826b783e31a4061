"""The one handle protocol of every way to record: ``step()``, ``remove()``, ``with``.

:func:`precguard.monitor`, :func:`precguard.recording` and :func:`precguard.watch`
each return a :class:`Handle` (op capture is ``monitor(..., level="op")``: the same
handle; ``@precision_monitor`` objects write into the open ``recording``). As torch's
``RemovableHandle``: removing twice is harmless, and the handle is a context manager
that removes at the end of the block, also when the block raises (the recording then
says ``complete: false`` and names the exception, which propagates).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from precguard.capture.hooks import HookHandle

H = TypeVar("H", bound="Handle")


class Handle:
    """What every way to record returns: ``step()``, ``remove()`` and context-manager use.

    It wraps a :class:`~precguard.capture.hooks.HookHandle` (:attr:`hooks`), the
    handle of the one hook layer: whatever a way to record attached goes there,
    and removing the handle removes it before closing what was recorded. One
    handle family, from a single tensor hook up to a whole recording.

    >>> with precguard.monitor(model, out="runs/cpu") as handle:   # doctest: +SKIP
    ...     for batch in batches:
    ...         model(batch)
    ...         handle.step()
    """

    def __init__(self, hooks: HookHandle | None = None) -> None:
        if hooks is None:
            from precguard.capture.hooks import HookHandle  # torch: not for a type annotation

            hooks = HookHandle()
        #: everything attached for this handle, removed first by :meth:`remove`
        self.hooks = hooks

    def step(self, *args: Any, **kwargs: Any) -> None:
        """End the current step; what is captured next belongs to the next one."""
        raise NotImplementedError

    def remove(self, error: BaseException | None = None) -> None:
        """Remove every hook and close what was recorded. Idempotent.

        ``error``: the exception that ended the recorded code, if any; the
        recording then says ``complete: false`` and names it (``with`` passes it).
        This base removes :attr:`hooks`; a way to record closes its recording after.
        """
        self.hooks.remove()

    def __enter__(self: H) -> H:
        return self

    def __exit__(self, exc_type: object, exc: BaseException | None, tb: object) -> None:
        self.remove(exc)
