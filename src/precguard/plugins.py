"""The plugin manager: built-in plugins plus lazily loaded entry points.

Environment variables:

``PRECGUARD_DISABLE_PLUGIN_AUTOLOAD=1``
    load no entry-point plugins (built-ins only).
``PRECGUARD_PLUGINS=cuda,ascend``
    load only these entry-point plugins (by entry-point name).
``PRECGUARD_TRACE_HOOKS=1``
    log every hook call and its results (pluggy's hook-call monitoring).
"""

from __future__ import annotations

import importlib
import os
import sys
from typing import TYPE_CHECKING, Any

import pluggy

from precguard import hookspecs
from precguard._logging import get_logger

if TYPE_CHECKING:
    import torch

    from precguard.backend import Backend

logger = get_logger(__name__)

hookimpl = pluggy.HookimplMarker("precguard")
pm = pluggy.PluginManager("precguard")
pm.add_hookspecs(hookspecs)

DEFAULT_PLUGINS: tuple[str, ...] = ("precguard.backends.cpu",)

_loaded = False
load_errors: dict[str, str] = {}


def load_plugins() -> pluggy.PluginManager:
    """Register built-in and entry-point plugins once; return the manager. Idempotent."""
    global _loaded
    if _loaded:
        return pm
    _loaded = True
    for name in DEFAULT_PLUGINS:
        if pm.get_plugin(name) is None:
            pm.register(importlib.import_module(name), name=name)
    if os.environ.get("PRECGUARD_DISABLE_PLUGIN_AUTOLOAD", "") in ("", "0"):
        _load_entry_points()
    if os.environ.get("PRECGUARD_TRACE_HOOKS", "") not in ("", "0"):
        pm.trace.root.setwriter(lambda msg: sys.stderr.write(msg))
        pm.enable_tracing()
    return pm


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    wanted = {n.strip() for n in os.environ.get("PRECGUARD_PLUGINS", "").split(",") if n.strip()}
    for ep in entry_points(group="precguard"):
        if wanted and ep.name not in wanted:
            continue
        if pm.get_plugin(ep.name) is not None:
            continue
        try:
            plugin = ep.load()
            pm.register(plugin, name=ep.name)
        except Exception as exc:  # a broken plugin must not take the others down
            load_errors[ep.name] = f"{type(exc).__name__}: {exc}"
            logger.error("plugin_load_failed", plugin=ep.name, cause=load_errors[ep.name])


def get_backend(device: str) -> Backend | None:
    """Return the backend that claims ``device``, or None if no plugin does."""
    return load_plugins().hook.precguard_backend(device=device)


def to_host(tensor: torch.Tensor) -> torch.Tensor | None:
    """Ask plugins to convert ``tensor`` to a plain CPU tensor; None when none needs to."""
    if tensor.device.type == "cpu":
        return None
    return load_plugins().hook.precguard_to_host(tensor=tensor)


def fingerprint(device: str) -> dict[str, Any]:
    """Merge every plugin's fingerprint for ``device`` into one dict."""
    merged: dict[str, Any] = {}
    for part in load_plugins().hook.precguard_fingerprint(device=device):
        if part:
            merged.update(part)
    return dict(sorted(merged.items()))
