"""Built-in plugin: registers precguard's own checks, exactly as a vendor plugin would."""

from __future__ import annotations

import importlib
from collections.abc import Callable

from precguard.plugins import hookimpl

#: one module per family; each exposes ``CHECKS``
FAMILY_MODULES: tuple[str, ...] = (
    "precguard.checks.env",
    "precguard.checks.rng",
    "precguard.checks.data",
    "precguard.checks.tokenizer",
    "precguard.checks.norm",
    "precguard.checks.rope",
    "precguard.checks.attention",
    "precguard.checks.ops",
    "precguard.checks.amp",
    "precguard.checks.grads",
    "precguard.checks.loss",
    "precguard.checks.reduce",
    "precguard.checks.layerwise",
)


@hookimpl
def precguard_register_checks(register: Callable[..., None]) -> None:
    """Register every built-in check (the family modules are imported on first use)."""
    for name in FAMILY_MODULES:
        for check in importlib.import_module(name).CHECKS:
            register(check)
