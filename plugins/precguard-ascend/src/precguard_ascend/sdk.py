"""Lazy access to ``torch_npu``: imported on first use, never at plugin load."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from precguard.backend import read_flag

NOT_INSTALLED = "torch_npu is not installed"


def torch_npu() -> ModuleType | None:
    """Return the ``torch_npu`` module (importing it registers the ``npu`` device), or None."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None


def get_option(sdk: ModuleType, name: str) -> Any:
    """Read an ACL option such as ``ACL_PRECISION_MODE`` (None when unset or unreadable)."""
    return read_flag(lambda: sdk._C._npu_getOption(name))
