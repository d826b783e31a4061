"""The plugin manager: built-in plugins plus lazily loaded entry points.

Built-in plugins (:data:`DEFAULT_PLUGINS`) are plain modules registered
exactly like third-party plugins, which arrive through the ``precguard``
entry-point group. Nothing is imported until the first call that needs a
plugin (:func:`load_plugins` is lazy and idempotent).

Environment variables:

``PRECGUARD_DISABLE_PLUGIN_AUTOLOAD=1``
    load no entry-point plugins (built-ins only).
``PRECGUARD_PLUGINS=cuda,ascend``
    load only these entry-point plugins (by entry-point name).
``PRECGUARD_TRACE_HOOKS=1``
    write every hook call to stderr: which plugins were asked, which one
    answered and with what.

A plugin that fails to import is recorded in :data:`load_errors` (name ->
cause) and logged; a hook implementation that raises is recorded in
:data:`hook_errors` and skipped. The other plugins keep working in both cases.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pluggy

from precguard import hookspecs
from precguard._logging import get_logger

if TYPE_CHECKING:
    import torch

    from precguard.backend import Backend
    from precguard.checks.base import Check

logger = get_logger(__name__)

hookimpl = pluggy.HookimplMarker("precguard")
pm = pluggy.PluginManager("precguard")
pm.add_hookspecs(hookspecs)

#: built-in plugin modules, registered under the last part of their name (the package's
#: name for a module called ``builtin``: ``precguard.checks.builtin`` is ``checks``)
DEFAULT_PLUGINS: tuple[str, ...] = (
    "precguard.backends.cpu",
    "precguard.backends.emu",
    "precguard.checks.builtin",
)
ENTRY_POINT_GROUP = "precguard"

#: plugin name -> "ExceptionType: message" for plugins that could not be loaded
load_errors: dict[str, str] = {}
#: "plugin.hook" -> "ExceptionType: message" for hook implementations that raised
hook_errors: dict[str, str] = {}


@dataclass
class PluginSource:
    """Where a registered plugin came from."""

    name: str
    builtin: bool
    module: str
    distribution: str | None = None
    version: str | None = None
    warnings: list[str] = field(default_factory=list)


_sources: dict[str, PluginSource] = {}
_loaded = False
_loading = False
_lock = threading.RLock()
_undo_monitoring: Callable[[], None] | None = None
#: PRECGUARD_TRACE_HOOKS as read by the last load, like the hook-call monitoring it installs
_tracing = False


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _trace(message: str) -> None:
    sys.stderr.write(f"precguard hook: {message}\n")


def load_plugins() -> pluggy.PluginManager:
    """Register built-in and entry-point plugins once and return the manager.

    Idempotent: later calls return the same manager at once. Call
    :func:`reset` first to load again (tests do, after changing the
    environment variables above).
    """
    global _loaded, _loading, _undo_monitoring, _tracing
    if _loaded:
        return pm
    with _lock:
        if _loaded or _loading:  # _loading: a plugin's import asked again (same thread)
            return pm
        _loading = True
        try:
            _load_all()
        finally:
            _loading = False
        _tracing = _env_on("PRECGUARD_TRACE_HOOKS")
        if _tracing:
            _undo_monitoring = pm.add_hookcall_monitoring(_trace_before, _trace_after)
        _loaded = True
    return pm


def _load_all() -> None:
    """Register the built-ins, then (unless disabled) the entry points."""
    for module_name in DEFAULT_PLUGINS:
        name = builtin_name(module_name)
        if pm.get_plugin(name) is not None:
            continue
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a broken built-in must not take the others down
            _record_load_error(name, exc)
            continue
        _register(module, PluginSource(name=name, builtin=True, module=module_name))
    if not _env_on("PRECGUARD_DISABLE_PLUGIN_AUTOLOAD"):
        _load_entry_points()


def builtin_name(module_name: str) -> str:
    """The plugin name of a built-in module: ``precguard.backends.cpu`` -> ``cpu``."""
    parts = module_name.split(".")
    if parts[-1] == "builtin" and len(parts) > 1:
        return parts[-2]
    return parts[-1]


def _record_load_error(name: str, exc: BaseException) -> None:
    load_errors[name] = f"{type(exc).__name__}: {exc}"
    logger.error("plugin_load_failed", plugin=name, cause=load_errors[name])


def _register(plugin: object, source: PluginSource) -> None:
    try:
        pm.register(plugin, name=source.name)
    except Exception as exc:  # pluggy validation: wrong hook signature and the like
        _record_load_error(source.name, exc)
        return
    known = {n for n in dir(hookspecs) if n.startswith("precguard_")}
    for attr in dir(plugin):
        if attr.startswith("precguard_") and attr not in known and callable(getattr(plugin, attr)):
            source.warnings.append(
                f"implements unknown hook {attr!r} (a typo, or written for a newer precguard)"
            )
            logger.warning("plugin_unknown_hook", plugin=source.name, hook=attr)
    _sources[source.name] = source


def _load_entry_points() -> None:
    from importlib.metadata import entry_points

    wanted = {n.strip() for n in os.environ.get("PRECGUARD_PLUGINS", "").split(",") if n.strip()}
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if wanted and ep.name not in wanted:
            continue
        if ep.name in _sources or ep.name in load_errors:
            if ep.name in _sources and _sources[ep.name].builtin:
                load_errors[ep.name] = (
                    f"NameConflict: entry point {ep.value!r} uses the name of a built-in plugin"
                )
            continue
        dist = getattr(ep, "dist", None)
        source = PluginSource(
            name=ep.name,
            builtin=False,
            module=ep.value,
            distribution=getattr(dist, "name", None),
            version=getattr(dist, "version", None),
        )
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            _record_load_error(ep.name, exc)
            continue
        _register(plugin, source)


def reset() -> None:
    """Unregister every plugin and forget load errors, so the next call loads afresh.

    For tests and long-lived hosts that change the plugin environment variables.
    """
    global _loaded, _undo_monitoring, _tracing
    with _lock:
        if _undo_monitoring is not None:
            _undo_monitoring()
            _undo_monitoring = None
        _tracing = False
        for name, plugin in list(pm.list_name_plugin()):
            pm.unregister(plugin=plugin, name=name)
        _sources.clear()
        load_errors.clear()
        hook_errors.clear()
        _loaded = False


def sources() -> dict[str, PluginSource]:
    """Return where each registered plugin came from, by plugin name."""
    load_plugins()
    return dict(_sources)


# -- calling hooks, one plugin at a time -------------------------------------------------


def call_hook(hook_name: str, *, firstresult: bool = False, **kwargs: Any) -> list[tuple[str, Any]]:
    """Call ``hook_name`` on each plugin in pluggy's order; return ``(plugin, result)`` pairs.

    Unlike ``pm.hook.NAME(...)``, an implementation that raises is reported
    (:data:`hook_errors`, an ``error`` log event) and skipped, and with
    ``PRECGUARD_TRACE_HOOKS`` each plugin's answer is traced. None results
    are dropped; with ``firstresult`` the first non-None result ends the call.
    Hook wrappers are not run on this path.
    """
    impls = _impls(hook_name)
    if _tracing:
        _trace(f"{hook_name}({_fmt_kwargs(kwargs)})")
    results: list[tuple[str, Any]] = []
    for impl in impls:
        result = _call_one(impl, hook_name, kwargs)
        if result is not None:
            results.append((impl.plugin_name, result))
            if firstresult:
                break
    return results


def _impls(hook_name: str) -> list[Any]:
    """The implementations of ``hook_name`` in the order pluggy calls them, wrappers left out."""
    caller = getattr(load_plugins().hook, hook_name)
    # pluggy calls the last registered (and tryfirst) implementations first
    return [i for i in reversed(caller.get_hookimpls()) if not (i.hookwrapper or i.wrapper)]


def _fmt_kwargs(kwargs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _trace_before(hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
    names = ", ".join(i.plugin_name for i in reversed(hook_impls))
    _trace(f"{hook_name}({_fmt_kwargs(kwargs)}) asks [{names}]")


def _trace_after(outcome: Any, hook_name: str, hook_impls: list[Any], kwargs: Any) -> None:
    exc = getattr(outcome, "exception", None)
    if exc is not None:
        _trace(f"  {hook_name} raised {type(exc).__name__}: {exc}")
    else:
        _trace(f"  {hook_name} -> {_short(outcome.get_result())}")


# -- what the rest of precguard asks of plugins ------------------------------------------


def get_backend(device: str) -> Backend | None:
    """Return the backend that claims ``device``, or None if no plugin does."""
    answers = call_hook("precguard_backend", firstresult=True, device=device)
    return answers[0][1] if answers else None


def device_types() -> dict[str, list[str]]:
    """Return the device types each plugin claims, by plugin name."""
    return {name: list(types) for name, types in call_hook("precguard_device_types")}


def to_host(tensor: torch.Tensor) -> torch.Tensor | None:
    """Ask plugins to convert ``tensor`` to a plain CPU tensor; None when none needs to."""
    if tensor.device.type == "cpu":
        return None
    answers = call_hook("precguard_to_host", firstresult=True, tensor=tensor)
    return answers[0][1] if answers else None


def fingerprint(device: str) -> dict[str, Any]:
    """Merge every plugin's fingerprint for ``device`` into one dict, sorted by key."""
    merged: dict[str, Any] = {}
    for _name, part in call_hook("precguard_fingerprint", device=device):
        merged.update(part)
    return dict(sorted(merged.items()))


def collect_checks() -> dict[str, Check]:
    """Return every check the plugins register, by check id.

    Plugins are asked in pluggy's order (the last registered first), so a
    plugin installed later can replace a check by registering the same id; the
    check it displaces is dropped with a ``check_id_taken`` warning naming both.
    """
    checks: dict[str, Check] = {}
    owners: dict[str, str] = {}
    for impl in _impls("precguard_register_checks"):

        def register(check: Check, _plugin: str = impl.plugin_name) -> None:
            if check.id in checks:
                logger.warning(
                    "check_id_taken", check=check.id, plugin=_plugin, owner=owners[check.id]
                )
                return
            checks[check.id] = check
            owners[check.id] = _plugin

        _call_one(impl, "precguard_register_checks", {"register": register})
    return checks


def vendor_dump(
    device: str, step: int, run_dir: str | os.PathLike[str], *, rank: int = 0
) -> list[dict[str, Any]]:
    """Collect each plugin's vendor state after ``step`` into ``RUN/rank{R}/vendor.jsonl``.

    Returns the lines written (``{"step", "plugin", "state"}``). Nothing is
    written when no plugin has anything to say.
    """
    rank_dir = Path(run_dir) / f"rank{rank}"
    lines: list[dict[str, Any]] = []
    for impl in _impls("precguard_vendor_dump"):
        kwargs = {"device": device, "step": step, "out_dir": rank_dir / "vendor" / impl.plugin_name}
        state = _call_one(impl, "precguard_vendor_dump", kwargs)
        if state is not None:
            lines.append({"step": step, "plugin": impl.plugin_name, "state": state})
    if lines:
        rank_dir.mkdir(parents=True, exist_ok=True)
        with open(rank_dir / "vendor.jsonl", "a", encoding="utf-8") as fh:
            for line in lines:
                fh.write(json.dumps(line, default=str) + "\n")
            fh.flush()
    return lines


def _call_one(impl: Any, hook_name: str, kwargs: dict[str, Any]) -> Any:
    try:
        result = impl.function(**{a: kwargs[a] for a in impl.argnames})
    except Exception as exc:
        key = f"{impl.plugin_name}.{hook_name}"
        hook_errors[key] = f"{type(exc).__name__}: {exc}"
        logger.error(
            "plugin_hook_failed", plugin=impl.plugin_name, hook=hook_name, cause=hook_errors[key]
        )
        if _tracing:
            _trace(f"  {impl.plugin_name} raised {hook_errors[key]}")
        return None
    if _tracing:
        _trace(f"  {impl.plugin_name} -> {_short(result)}")
    return result


def describe() -> dict[str, Any]:
    """Return what ``precguard plugins --json`` prints: every plugin and every load error.

    Each plugin entry has its name, whether it is built in, its module,
    distribution and version, the device types it claims, the hooks it
    implements and any warnings found while registering it.
    """
    load_plugins()
    from precguard import __version__

    claimed = device_types()
    entries = []
    for name, source in sorted(_sources.items(), key=lambda kv: (not kv[1].builtin, kv[0])):
        plugin = pm.get_plugin(name)
        if plugin is None:
            continue
        hooks = sorted(c.name for c in (pm.get_hookcallers(plugin) or []))
        entries.append(
            {
                "name": name,
                "builtin": source.builtin,
                "module": source.module,
                "distribution": source.distribution or ("precguard" if source.builtin else None),
                "version": source.version or (__version__ if source.builtin else None),
                "device_types": claimed.get(name, []),
                "hooks": hooks,
                "warnings": list(source.warnings),
            }
        )
    errors = [{"name": n, "cause": c} for n, c in sorted(load_errors.items())]
    failed_hooks = [
        {"plugin": k.split(".", 1)[0], "hook": k.split(".", 1)[1], "cause": c}
        for k, c in sorted(hook_errors.items())
    ]
    return {
        "schema_version": 1,
        "plugins": entries,
        "load_errors": errors,
        "hook_errors": failed_hooks,
    }
