"""The hooks precguard calls: this module is the ``ascend`` entry point.

Nothing here imports torch_npu; :mod:`precguard_ascend.sdk` does, on first use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from precguard import hookimpl
from precguard.backend import Backend
from precguard_ascend.backend import AscendBackend

if TYPE_CHECKING:
    from precguard.checks.base import Check  # checks are imported when first asked for


@hookimpl
def precguard_register_backends(register: Callable[[type[Backend]], None]) -> None:
    """Register :class:`AscendBackend` (``npu``, ``npu:N``), with or without torch_npu."""
    register(AscendBackend)


@hookimpl
def precguard_register_checks(register: Callable[[Check], None]) -> None:
    """Register the ``env.ascend_*`` and ``env.npu_*`` checks."""
    from precguard_ascend.checks import CHECKS

    for check in CHECKS:
        register(check)
