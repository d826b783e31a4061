"""Hook specifications of the ``precguard`` pluggy project.

A plugin is a module or object with functions named like these specs and
decorated with ``precguard.hookimpl``. Built-in plugins (``cpu``, ``emu``)
are registered exactly like third-party ones, which arrive through the
``precguard`` entry-point group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch

    from precguard.backend import Backend

hookspec = pluggy.HookspecMarker("precguard")


@hookspec(firstresult=True)
def precguard_backend(device: str) -> Backend | None:
    """Return the backend for ``device``, or None if the device is not yours.

    :param device: a device string as the user wrote it, e.g. ``"cuda:1"``,
        ``"npu"``, ``"emu:fp16"``.

    Stops at the first non-None result. Return a backend even when the
    device cannot be used here (SDK missing): its ``availability()`` then
    says why, so the user learns the reason instead of "unknown device".
    """


@hookspec
def precguard_device_types() -> list[str]:
    """Return the device types this plugin claims (``["npu"]``), for listings."""


@hookspec
def precguard_fingerprint(device: str) -> dict[str, Any] | None:
    """Return environment facts that change numerics on ``device``, or None.

    :param device: the device string being recorded or inspected.

    Every plugin may contribute (versions, flags, environment variables);
    the results are merged into the recording's manifest.
    """


@hookspec(firstresult=True)
def precguard_to_host(tensor: torch.Tensor) -> torch.Tensor | None:
    """Return a plain, contiguous CPU copy of ``tensor``, or None if it is not yours.

    :param tensor: a tensor about to be saved in a recording.

    Stops at the first non-None result; implement it for devices whose
    tensors need conversion first (internal formats, special layouts).
    """


@hookspec
def precguard_register_checks(register: Callable[..., None]) -> None:
    """Register checklist checks by calling ``register(check)`` for each.

    :param register: call it with each check object (see ``precguard.checks``).
    """
