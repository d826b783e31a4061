"""Built-in plugin: registers precguard's own checks, exactly as a vendor plugin would."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from precguard.checks.base import FAMILIES
from precguard.hookspecs import hookimpl

#: one module per family, named after it; each exposes ``CHECKS``
FAMILY_MODULES: tuple[str, ...] = tuple(f"precguard.checks.{family}" for family in FAMILIES)


@hookimpl
def precguard_register_checks(register: Callable[..., None]) -> None:
    """Register every built-in check (the family modules are imported on first use)."""
    for name in FAMILY_MODULES:
        for check in importlib.import_module(name).CHECKS:
            register(check)
