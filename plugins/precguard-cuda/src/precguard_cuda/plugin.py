"""The hooks precguard calls: this module is the ``cuda`` entry point."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from precguard import hookimpl
from precguard.backend import Backend
from precguard_cuda.backend import CudaBackend

if TYPE_CHECKING:
    from precguard.checks.base import Check  # checks are imported when first asked for


@hookimpl
def precguard_register_backends(register: Callable[[type[Backend]], None]) -> None:
    """Register :class:`CudaBackend` (``cuda``, ``cuda:N``)."""
    register(CudaBackend)


@hookimpl
def precguard_register_checks(register: Callable[[Check], None]) -> None:
    """Register the ``env.cuda_*`` checks."""
    from precguard_cuda.checks import CHECKS

    for check in CHECKS:
        register(check)
