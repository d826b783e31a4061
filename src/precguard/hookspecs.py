"""Hook specifications of the ``precguard`` pluggy project.

A plugin is a module or object with functions named like these specs and
decorated with ``precguard.hookimpl``. Built-in plugins (``cpu``, ``emu``)
are registered exactly like third-party ones, which arrive through the
``precguard`` entry-point group. ``docs/plugins.md`` walks through each hook
with a worked plugin for an imaginary chip.

Every hook is called with keyword arguments, so an implementation may
declare only the parameters it needs. A hook that raises is reported with
the plugin's name and skipped; the other plugins still answer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import torch

    from precguard.backend import Backend
    from precguard.checks.base import Check

hookspec = pluggy.HookspecMarker("precguard")


@hookspec(firstresult=True)
def precguard_backend(device: str) -> Backend | None:
    """Return the backend for ``device``, or None if the device is not yours.

    :param device: a device string as the user wrote it, e.g. ``"cuda:1"``,
        ``"npu"``, ``"emu:fp16"``.
    :return: a :class:`~precguard.backend.Backend` for the device, or None.

    Stops at the first non-None result. Return a backend even when the
    device cannot be used here (SDK missing): its ``availability()`` then
    says why, so the user learns the reason instead of "unknown device".
    """


@hookspec
def precguard_device_types() -> list[str]:
    """Return the device types this plugin claims, for listings and error messages.

    :return: device type prefixes such as ``["npu"]`` or ``["emu"]``; an empty
        list for a plugin that claims no device (checks only).
    """


@hookspec
def precguard_fingerprint(device: str) -> dict[str, Any] | None:
    """Return environment facts that change numerics on ``device``, or None.

    :param device: the device string being recorded or inspected.
    :return: a flat mapping of dotted names to JSON values (versions, flags,
        environment variables: ``{"npu.conv.allow_hf32": True,
        "env.HCCL_DETERMINISTIC": None}``), or None when you have nothing to add.

    Every plugin may contribute; the results are merged into one dict that is
    stored in each recording's manifest and printed by ``precguard env``.
    Must work without the device's SDK: report what you can (environment
    variables) and say that the SDK is missing.
    """


@hookspec(firstresult=True)
def precguard_to_host(tensor: torch.Tensor) -> torch.Tensor | None:
    """Return a plain, contiguous CPU copy of ``tensor``, or None if it is not yours.

    :param tensor: a tensor about to be saved in a recording.
    :return: a CPU tensor with torch's standard strided layout, or None.

    Stops at the first non-None result. Implement it for devices whose
    tensors need conversion first (internal formats, special layouts); the
    default is ``tensor.detach().to("cpu").contiguous()``.
    """


@hookspec
def precguard_vendor_dump(device: str, step: int, out_dir: Path) -> dict[str, Any] | None:
    """Record vendor-specific device state at the end of a recorded step, or return None.

    :param device: the device string being recorded.
    :param step: the 0-based step that just ended.
    :param out_dir: a directory of this plugin's own inside the recording
        (``RUN/rank{R}/vendor/{plugin}/``) for larger files; it may not exist
        yet, so create it (``mkdir(parents=True, exist_ok=True)``) before writing.
    :return: a small JSON-serialisable mapping (e.g. ``{"overflow_flag": True}``
        for a chip in saturation mode, where overflow is only visible in a
        status register), appended to ``RUN/rank{R}/vendor.jsonl`` with the
        plugin name and step; or None when you have nothing to record.
    """


@hookspec
def precguard_register_checks(register: Callable[[Check], None]) -> None:
    """Register checklist checks by calling ``register(check)`` for each.

    :param register: call it with each :class:`~precguard.checks.base.Check`.
    :return: nothing; the return value is ignored.

    Vendor checks use the ``env`` family (``env.npu_conv_hf32``) and should
    return a ``skip`` finding for devices that are not theirs.
    """
