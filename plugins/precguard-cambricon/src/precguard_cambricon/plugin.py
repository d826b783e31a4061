"""The hooks precguard calls: this module is the ``cambricon`` entry point.

Nothing here imports torch_mlu; :mod:`precguard_cambricon.backend` does, on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from precguard import hookimpl
from precguard.backend import Backend
from precguard_cambricon.backend import CambriconBackend

if TYPE_CHECKING:
    from precguard.checks.base import Check  # checks are imported when first asked for


@hookimpl
def precguard_register_backends(register: Callable[[type[Backend]], None]) -> None:
    """Register :class:`CambriconBackend` (``mlu``, ``mlu:N``), with or without torch_mlu."""
    register(CambriconBackend)


@hookimpl
def precguard_register_checks(register: Callable[[Check], None]) -> None:
    """Register the ``env.mlu_*`` checks."""
    from precguard_cambricon.checks import CHECKS

    for check in CHECKS:
        register(check)
