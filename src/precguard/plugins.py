"""The plugin registry: built-in plugins and ``precguard`` entry points, on pluggy's facilities.

A plugin that fails to import, or whose ``register_*`` hook raises, is left out alone and named
in :data:`load_errors`; the environment variables that steer loading: docs/plugins.md.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

import pluggy
import torch

from precguard import hookspecs
from precguard._logging import get_logger
from precguard.backend import Backend, Switch, device_fingerprint

logger = get_logger(__name__)
hookimpl = hookspecs.hookimpl  # re-exported: plugins written against precguard.plugins
pm = pluggy.PluginManager("precguard")
pm.add_hookspecs(hookspecs)
#: the built-in plugin modules and their names, registered like entry points
DEFAULT_PLUGINS = ("precguard.backends.cpu", "precguard.backends.emu", "precguard.checks.builtin")
BUILTINS = ("cpu", "emu", "checks")
ENTRY_POINT_GROUP = "precguard"
#: plugin name -> "ExceptionType: message" for plugins that could not be loaded or registered
load_errors: dict[str, str] = {}
_trace, _lock = pm.trace.root.get("registry"), threading.RLock()
_registries: dict[str, tuple[list[tuple[str, Any]], dict[str, hookspecs.Registration]]] = {}
_loaded = _loading = False
_undo_tracing: Callable[[], None] | None = None


def _failed(name: str, cause: str, event: str = "plugin_load_failed") -> None:
    load_errors[name] = cause
    logger.error(event, plugin=name, cause=cause)
    _trace(f"{name} left out: {cause}")


def load_plugins() -> pluggy.PluginManager:
    """Register the built-in and entry-point plugins once; return :data:`pm` (idempotent)."""
    global _loaded, _loading, _undo_tracing
    if _loaded:
        return pm
    on = {k for k, v in os.environ.items() if v.strip().lower() not in ("", "0", "false", "no")}
    with _lock:
        if _loaded or _loading:  # _loading: a plugin's import asked again (same thread)
            return pm
        _loading = True
        try:
            if "PRECGUARD_TRACE_HOOKS" in on:
                pm.trace.root.setwriter(lambda text: sys.stderr.write(text))
                _undo_tracing = pm.enable_tracing()
            for module_name, name in zip(DEFAULT_PLUGINS, BUILTINS, strict=True):
                try:
                    pm.has_plugin(name) or pm.register(importlib.import_module(module_name), name)
                except Exception as exc:  # a broken built-in must not take the others down
                    _failed(name, f"{type(exc).__name__}: {exc}")
            from importlib.metadata import entry_points

            wanted = {n.strip() for n in os.environ.get("PRECGUARD_PLUGINS", "").split(",")} - {""}
            autoload = "PRECGUARD_DISABLE_PLUGIN_AUTOLOAD" not in on
            names = [ep.name for ep in entry_points(group=ENTRY_POINT_GROUP)] if autoload else []
            for name in dict.fromkeys(names):
                if wanted and name not in wanted:
                    pm.set_blocked(name)
                elif name in BUILTINS:
                    load_errors[name] = f"NameConflict: entry point {name!r} is a built-in's name"
                else:
                    try:  # pluggy's loader, one name at a time: a broken plugin is left out alone
                        pm.load_setuptools_entrypoints(ENTRY_POINT_GROUP, name=name)
                    except Exception as exc:
                        _failed(name, f"{type(exc).__name__}: {exc}")
            for name, hook in [(n, h) for n, p in pm.list_name_plugin() for h in unknown_hooks(p)]:
                logger.warning("plugin_unknown_hook", plugin=name, hook=hook)
            _loaded = True
        finally:
            _loading = False
    registered("backends")  # cheap: a plugin whose registration raises is named at load
    return pm


def unknown_hooks(plugin: object) -> list[str]:
    """The ``hookimpl``-marked names of ``plugin`` that match no hook spec (typos)."""
    return sorted(c.name for c in pm.get_hookcallers(plugin) or [] if not c.has_spec())


def reset() -> None:
    """Unregister and unblock every plugin and forget load errors; the next call loads afresh."""
    global _loaded, _undo_tracing
    with _lock:
        if _undo_tracing is not None:
            _undo_tracing = _undo_tracing() or pm.trace.root.setwriter(None)
        for name, plugin in pm.list_name_plugin():
            pm.unregister(plugin, name) if plugin is not None else pm.unblock(name)
        _registries.clear()
        load_errors.clear()
        _loaded = False


def registered(kind: str) -> dict[str, hookspecs.Registration]:
    """What the plugins register through ``precguard_register_{kind}`` (``backends``, ``checks``,
    ``switches``), by key, with the plugin of each; kept until the set of plugins changes."""
    load_plugins()
    with _lock:
        cached = _registries.get(kind)
        if cached is None or cached[0] != pm.list_name_plugin():
            found, failed = hookspecs.register_each(pm, f"precguard_register_{kind}")
            for name, cause in failed.items():
                _failed(name, cause, "plugin_registration_failed")
                pm.unregister(name=name)
            cached = _registries[kind] = (pm.list_name_plugin(), found)
        return cached[1]


def collect_checks() -> dict[str, Any]:
    """Return every check the plugins register, by id (a later plugin's wins)."""
    return {check_id: entry.item for check_id, entry in registered("checks").items()}


def collect_switches(device: str | None = None) -> list[Switch]:
    """Return the device switches plugins declare as remedies; with ``device``, those for it."""
    found = (entry.item for entry in registered("switches").values())
    return [switch for switch in found if device is None or switch.applies_to(device)]


def get_backend(device: str) -> Backend | None:
    """Return a backend for ``device`` (``"npu:1"``), usable or not; None if no plugin claims it."""
    entry = registered("backends").get(device.split(":", 1)[0])
    if _undo_tracing is not None:
        answer = f"{entry.item.__name__} ({entry.plugin})" if entry else "no plugin claims it"
        _trace(f"backend for {device!r}: {answer}")
    return None if entry is None else entry.item(device)


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """A plain, contiguous CPU copy of ``tensor``, through its device's backend."""
    if (device := str(tensor.device)) == "cpu":
        return tensor.detach().to("cpu", copy=True).contiguous()
    return (get_backend(device) or Backend(device)).to_host(tensor)


def fingerprint(device: str) -> dict[str, Any]:
    """Return the environment fingerprint of ``device``: torch's facts and its backend's."""
    return device_fingerprint(get_backend(device))
