"""The recordings open in the current context, innermost last.

A ``ContextVar`` holding a tuple that is replaced on every change: each thread
and asyncio task sees the recordings opened in its own context. Kept apart from
``capture.api`` so that what records into the open recording from below the API
(``capture.collectives``) reaches it without importing the API.
"""

from __future__ import annotations

from contextvars import ContextVar
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from precguard.capture.recording import Recording

ACTIVE: ContextVar[tuple[Recording, ...]] = ContextVar("precguard_active", default=())


def active_recording() -> Recording | None:
    """Return the innermost recording open in this context (``record`` or ``monitor`` with
    ``out``), or None."""
    stack = ACTIVE.get()
    return stack[-1] if stack else None


def push(recording: Recording) -> None:
    """Make ``recording`` the innermost open recording of this context."""
    ACTIVE.set((*ACTIVE.get(), recording))


def pop(recording: Recording) -> bool:
    """Take ``recording`` off this context's open recordings; False if it was not on them."""
    stack = ACTIVE.get()
    if recording not in stack:
        return False
    ACTIVE.set(tuple(r for r in stack if r is not recording))
    return True
