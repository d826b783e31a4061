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
from typing import TYPE_CHECKING, Any, NamedTuple

import pluggy

from precguard._logging import get_logger

if TYPE_CHECKING:
    from precguard.backend import Backend, Switch
    from precguard.checkspec import Check

logger = get_logger(__name__)
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

    :param register: call it with each :class:`~precguard.checkspec.Check` (also
        importable as ``precguard.checks.base.Check``).
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


class Registration(NamedTuple):
    """One thing a plugin registered through a ``register_*`` hook, and the plugin's name."""

    item: Any
    plugin: str


#: what each hook's ``register`` takes: the attribute an item is filed under (a non-empty
#: string), whether the item is a class (a Backend subclass) or an instance, what the hook
#: takes in words, and the key's name in log events (``device_type_taken``)
REGISTERS: dict[str, tuple[str, bool, str, str]] = {
    "precguard_register_backends": ("device_type", True, "a Backend subclass", "device_type"),
    "precguard_register_checks": ("id", False, "a Check", "check"),
    "precguard_register_switches": ("name", False, "a precguard.Switch", "switch"),
}


def _key(hook_name: str, item: Any) -> str:
    attribute, is_class, expected, _ = REGISTERS[hook_name]
    key = getattr(item, attribute, None)
    if not (key and isinstance(key, str)) or isinstance(item, type) != is_class:
        raise TypeError(f"register() expects {expected} with a {attribute}, got {item!r}")
    return key


def register_each(
    pm: pluggy.PluginManager, hook_name: str
) -> tuple[dict[str, Registration], dict[str, str]]:
    """Call the ``register_*`` hook ``hook_name`` once per plugin, each with its own ``register``.

    How every registration hook is called: one plugin at a time (pluggy's
    ``subset_hook_caller``, so a hook wrapper runs around its own plugin's
    call), in pluggy's order (the last registered and ``tryfirst`` first), so
    the first registration of a key wins and a later one is logged as
    displaced (``device_type_taken``...). An item is filed under its key
    (:data:`REGISTERS`); a ``register`` given what its hook does not take,
    or kept and called after its hook returned, raises.

    :return: what was registered, by key; and the plugins whose call raised
        (name -> cause), of which nothing is kept.
    """
    field = REGISTERS[hook_name][3]
    found: dict[str, Registration] = {}
    failed: dict[str, str] = {}
    for impl in reversed(getattr(pm.hook, hook_name).get_hookimpls()):
        name, mine, open_ = impl.plugin_name, {}, [True]

        def register(item: Any, mine: dict[str, Any] = mine, open_: list[bool] = open_) -> None:
            if not open_:
                raise RuntimeError(f"register() was called after {hook_name} returned")
            mine.setdefault(_key(hook_name, item), item)

        register.__qualname__ = f"register_for_{name}"  # names the plugin in pluggy's trace
        try:
            others = [p for p in pm.get_plugins() if p is not impl.plugin]
            pm.subset_hook_caller(hook_name, others)(register=register)
        except Exception as exc:
            failed[name] = f"{hook_name} raised {type(exc).__name__}: {exc}"
            continue
        finally:
            open_.clear()
        for item_key, item in mine.items():
            if item_key in found:
                owner = found[item_key].plugin
                logger.warning(f"{field}_taken", **{field: item_key}, plugin=name, owner=owner)
            else:
                found[item_key] = Registration(item, name)
                pm.trace.root.get("registry")(f"{name} registers {field} {item_key!r}: {item!r}")
    return found, failed
