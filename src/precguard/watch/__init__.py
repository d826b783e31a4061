"""The long-run training monitor: ``precguard.watch(model, optimizer, every=N, out=DIR)``.

See :mod:`precguard.watch.handle` and docs/watch.md.

``precguard.watch`` is both this package and the function users call
(``precguard.watch(model, ...)``): importing a submodule makes Python set
the package as the attribute ``watch`` of ``precguard``, so the package itself
is callable and forwards to :func:`precguard.watch.handle.watch`.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from precguard.watch.alerts import Alert, WatchOptions
from precguard.watch.handle import WatchHandle, watch

__all__ = ["Alert", "WatchHandle", "WatchOptions", "watch"]


class _CallablePackage(types.ModuleType):
    """This package, callable as :func:`watch`."""

    def __call__(self, *args: Any, **kwargs: Any) -> WatchHandle:
        return watch(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage
