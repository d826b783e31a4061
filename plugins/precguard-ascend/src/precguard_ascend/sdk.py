"""Lazy access to ``torch_npu``: imported on first use, never at plugin load."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from types import ModuleType
from typing import Any

NOT_INSTALLED = "torch_npu is not installed"


def torch_npu() -> ModuleType | None:
    """Return the ``torch_npu`` module (importing it registers the ``npu`` device), or None."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None


def read(getter: Callable[[], Any]) -> Any:
    """Read one setting; None when this torch_npu version lacks it or reading fails."""
    try:
        value = getter()
    except Exception:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def get_option(sdk: ModuleType, name: str) -> Any:
    """Read an ACL option such as ``ACL_PRECISION_MODE`` (None when unset or unreadable)."""
    return read(lambda: sdk._C._npu_getOption(name))
