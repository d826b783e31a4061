"""Hook specifications of the ``precguard`` pluggy project.

Hooks only *register* things: a plugin hands precguard its backend classes
and its checks, and everything a device does lives on its
:class:`~precguard.backend.Backend` (availability, seeding, determinism,
fingerprint, ``to_host``, ``vendor_state``). This is the shape of pytest's
and simonw/llm's ``register_*(register)`` hooks.

A plugin is a module or object with functions named like these specs and
decorated with ``precguard.hookimpl``. Built-in plugins (``cpu``, ``emu``,
``checks``) are registered exactly like third-party ones, which arrive
through the ``precguard`` entry-point group. ``docs/plugins.md`` walks through
both hooks with a worked plugin for an imaginary chip.

Every hook is called with keyword arguments through pluggy, one plugin at a
time with a ``register`` bound to that plugin, so ``tryfirst``/``trylast``
order the plugins and a hook wrapper runs around its own plugin's call. A
plugin whose registration hook raises is reported by name (``precguard
plugins`` lists it as failed) and unregistered; the other plugins still work.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import pluggy

if TYPE_CHECKING:
    from precguard.backend import Backend, Switch
    from precguard.checks.base import Check

hookspec = pluggy.HookspecMarker("precguard")
#: the marker of hook implementations (``from precguard import hookimpl``); here beside the
#: specs, as in llm, so a plugin imports the specs' module and never the plugin manager
hookimpl = pluggy.HookimplMarker("precguard")


@hookspec
def precguard_register_backends(register: Callable[[type[Backend]], None]) -> None:
    """Register backend classes by calling ``register(backend_class)`` for each.

    :param register: call it with each :class:`~precguard.backend.Backend`
        subclass this plugin provides. The class's ``device_type`` (``"npu"``)
        is the device type it claims; precguard builds ``backend_class(device)``
        for a device string of that type (``"npu"``, ``"npu:1"``).
    :return: nothing; the return value is ignored.

    Register your backend even when its SDK is missing: its ``availability()``
    then says why the device cannot be used, so the user learns the reason
    instead of "unknown device". Plugins registered later are asked first, so
    the first class registered for a device type wins; a displaced one is
    logged (``device_type_taken``).
    """


@hookspec
def precguard_register_checks(register: Callable[[Check], None]) -> None:
    """Register checklist checks by calling ``register(check)`` for each.

    :param register: call it with each :class:`~precguard.checks.base.Check`.
    :return: nothing; the return value is ignored.

    Vendor checks use the ``env`` family (``env.npu_conv_hf32``) and should
    return a ``skip`` finding for devices that are not theirs. Plugins
    registered later are asked first, so the first check registered for an id
    wins; a displaced one is logged (``check_taken``).
    """


@hookspec
def precguard_register_switches(register: Callable[[Switch], None]) -> None:
    """Register device switches a user can try as remedies, calling ``register(switch)``.

    :param register: call it with each :class:`~precguard.backend.Switch`: a
        name, the device patterns it applies to, a summary, and either the
        device to run on ``instead`` or an ``apply()`` context manager that sets
        the vendor flag and restores it.
    :return: nothing; the return value is ignored.

    ``precguard compare --verify`` and ``check --verify`` re-run the whole
    actual side with each switch that applies to its device and say whether
    the output error falls to the floor of a correct run. Plugins registered
    later are asked first, so the first switch registered for a name wins; a
    displaced one is logged (``switch_taken``).
    """
