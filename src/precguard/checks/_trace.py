"""Watching ops during a forward pass without changing what they compute.

:func:`watch_ops` runs a forward under a ``TorchFunctionMode`` that calls a
callback with each op, its arguments, its result and the qualified name of the
module running it. The result is the op's own result, untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from torch import nn
from torch.overrides import TorchFunctionMode

OpCallback = Callable[[str, tuple, dict, Any, str], None]


class _WatchMode(TorchFunctionMode):
    def __init__(self, names: set[str] | None, callback: OpCallback, stack: list[str]) -> None:
        super().__init__()
        self.names = names
        self.callback = callback
        self.stack = stack

    def __torch_function__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        name = getattr(func, "__name__", "")
        if self.names is None or name in self.names:
            self.callback(name, args, kwargs, result, self.stack[-1] if self.stack else "root")
        return result


@contextmanager
def watch_ops(model: nn.Module, names: set[str] | None, callback: OpCallback) -> Iterator[None]:
    """Call ``callback(op, args, kwargs, result, module)`` for ops named in ``names`` (all if None).

    Enter it *inside* the device's numerics context so the callback sees the
    device's results.
    """
    stack: list[str] = []
    handles = []
    for name, mod in model.named_modules():
        qual = name or "root"

        def pre(_m: nn.Module, _a: Any, _qual: str = qual) -> None:
            stack.append(_qual)

        def post(_m: nn.Module, _a: Any, _o: Any) -> None:
            if stack:
                stack.pop()

        handles.append(mod.register_forward_pre_hook(pre))
        handles.append(mod.register_forward_hook(post))
    try:
        with _WatchMode(names, callback, stack):
            yield
    finally:
        for h in handles:
            h.remove()
