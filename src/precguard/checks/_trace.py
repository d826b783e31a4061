"""Watching ops during a forward pass without changing what they compute.

:func:`watch_ops` watches the ops of a forward through the one op layer
(:func:`precguard.capture.hooks.on_ops`): a callback with each op, its
arguments, its result and the qualified name of the module running it. The
result is the op's own result, untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn

from precguard.capture.hooks import OpsHandle, on_ops

OpCallback = Callable[[str, tuple, dict, Any, str], None]


def watch_ops(model: nn.Module, names: set[str] | None, callback: OpCallback) -> OpsHandle:
    """Call ``callback(op, args, kwargs, result, module)`` for ops named in ``names`` (all if None).

    Returns a handle to enter (``with watch_ops(...):``) *inside* the device's
    numerics context so the callback sees the device's results; leaving it
    removes every hook. A callback that raises is an error of the check, not
    reported and skipped: the check would conclude from ops it never saw.
    """
    return on_ops(callback, model=model, ops=names, errors="raise")
