"""Lazy access to ``torch_npu``: imported on first use, never at plugin load."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any

from precguard.backend import read_flag

NOT_INSTALLED = "torch_npu is not installed"
#: what an ACL option reads as when torch_npu has no value set (the chip's default applies)
UNSET = "unset"


def torch_npu() -> ModuleType | None:
    """Return the ``torch_npu`` module (importing it registers the ``npu`` device), or None."""
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None


def get_option(sdk: ModuleType, name: str) -> Any:
    """Read an ACL option such as ``ACL_PRECISION_MODE``.

    Returns its value, :data:`UNSET` when no value is set (the chip's default
    applies), or None when it could not be read (an SDK without the getter).
    """
    try:
        value = sdk._C._npu_getOption(name)
    except Exception:
        return None
    if value is None or value in (b"", ""):
        return UNSET
    return read_flag(lambda: value)
