"""Watching ops during a forward pass without changing what they compute.

:func:`watch_ops` watches the ops of a forward through the one op layer
(:func:`precguard.capture.hooks.on_ops`): a callback with each op, its
arguments, its result and the qualified name of the module running it. The
result is the op's own result, untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

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


#: where a shared watch rides: a side's plain forward (``device``, ``reference``) or the
#: fp64 oracle's forward of the reference model (``oracle``), each run once per checklist
Side = Literal["device", "reference", "oracle"]


@dataclass(frozen=True)
class SharedWatch:
    """An op watch that rides on a forward the lab runs anyway, instead of a forward of its own.

    ``make(records)`` returns the op callback that appends what it sees to ``records``.
    """

    ops: frozenset[str]
    make: Callable[[list[dict[str, Any]]], OpCallback]
    sides: frozenset[Side]


#: the shared watches, by name; a check module registers its own at import, before any
#: checklist runs (:meth:`precguard.checks._lab.Lab.watched` reads what they recorded)
SHARED_WATCHES: dict[str, SharedWatch] = {}


def shared_watch(model: nn.Module, side: Side) -> tuple[OpsHandle | None, dict[str, list]]:
    """One op watch feeding every shared watch of ``side``, and the records it fills by name.

    The handle is None when no watch rides on ``side``.
    """
    watches = {name: w for name, w in SHARED_WATCHES.items() if side in w.sides}
    records: dict[str, list[dict[str, Any]]] = {name: [] for name in watches}
    callbacks = {name: w.make(records[name]) for name, w in watches.items()}
    ops = {op for w in watches.values() for op in w.ops}

    def seen(op: str, args: tuple, kwargs: dict, result: Any, module: str) -> None:
        for name, w in watches.items():
            if op in w.ops:
                callbacks[name](op, args, kwargs, result, module)

    return (watch_ops(model, ops, seen) if ops else None), records
