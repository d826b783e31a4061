"""The plugin manager: built-in plugins plus lazily loaded entry points, in llm's shape.

Built-in plugins (:data:`DEFAULT_PLUGINS`) are plain modules registered exactly
like the ``precguard`` entry points; nothing is imported before the first call
that needs a plugin (:func:`load_plugins` is lazy and idempotent). Plugins only
register things (:mod:`precguard.hookspecs`). Each plugin is asked on its own,
through pluggy's ``subset_hook_caller``, with a ``register`` bound to it: what it
registers is its own by construction, and a plugin whose hook raises is left out
alone (unregistered, listed in :data:`load_errors`) while the others' stand. A
hook wrapper runs around its own plugin's call; ``tryfirst``/``trylast`` order
the plugins as pluggy documents.

``PRECGUARD_DISABLE_PLUGIN_AUTOLOAD=1`` loads no entry points (built-ins only);
``PRECGUARD_PLUGINS=cuda,ascend`` only these entry points;
``PRECGUARD_TRACE_HOOKS=1`` writes every hook call to stderr (which plugin was
asked, what it registered).
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import pluggy

from precguard import hookspecs
from precguard._logging import get_logger
from precguard.backend import Backend, torch_facts

if TYPE_CHECKING:
    import torch

logger = get_logger(__name__)

hookimpl = hookspecs.hookimpl  # re-exported: plugins written against precguard.plugins


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, counting changes to the set of plugins (:attr:`generation`).

    The registries the hooks fill are kept until the set changes, by precguard
    or directly on :data:`pm`, so :func:`get_backend` costs a dict access.
    """

    generation: int = 0

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin`` (see pluggy) and mark the registries stale."""
        self.generation += 1
        return super().register(plugin, name)

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        """Unregister ``plugin`` or ``name`` (see pluggy) and mark the registries stale."""
        self.generation += 1
        return super().unregister(plugin, name)


pm = PluginManager("precguard")
pm.add_hookspecs(hookspecs)

#: built-in plugin modules, registered under the last part of their name (the package's
#: name for a module called ``builtin``: ``precguard.checks.builtin`` is ``checks``)
DEFAULT_PLUGINS: tuple[str, ...] = (
    "precguard.backends.cpu",
    "precguard.backends.emu",
    "precguard.checks.builtin",
)
ENTRY_POINT_GROUP = "precguard"

#: plugin name -> "ExceptionType: message" for plugins that could not be loaded or registered
load_errors: dict[str, str] = {}


@dataclass
class PluginSource:
    """Where a registered plugin came from."""

    name: str
    builtin: bool
    module: str
    distribution: str | None = None
    version: str | None = None
    warnings: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Registration:
    """One thing a plugin registered: a backend class or a check, and the plugin's name."""

    item: Any
    plugin: str


@runtime_checkable
class CheckLike(Protocol):
    """What the registry needs of a check (``precguard.checks.base.Check`` is one)."""

    id: str
    func: Callable[..., Any]


_sources: dict[str, PluginSource] = {}
#: hook name -> (pm.generation it was built at, what the hook registered, by key)
_registries: dict[str, tuple[int, dict[str, Registration]]] = {}
_loaded = False
_loading = False
_lock = threading.RLock()
_undo_monitoring: Callable[[], None] | None = None
_tracing = False  # PRECGUARD_TRACE_HOOKS as read by the last load


def _env_on(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _trace(message: str) -> None:
    sys.stderr.write(f"precguard hook: {message}\n")


def _short(value: Any, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def load_plugins() -> pluggy.PluginManager:
    """Register built-in and entry-point plugins once and return the manager.

    Idempotent: later calls return the same manager at once. Call :func:`reset`
    first to load again (tests do, after changing the environment variables).
    """
    global _loaded, _loading, _undo_monitoring, _tracing
    if _loaded:
        return pm
    with _lock:
        if _loaded or _loading:  # _loading: a plugin's import asked again (same thread)
            return pm
        _loading = True
        try:
            for module_name in DEFAULT_PLUGINS:
                _load_builtin(module_name)
            if not _env_on("PRECGUARD_DISABLE_PLUGIN_AUTOLOAD"):
                _load_entry_points()
            _tracing = _env_on("PRECGUARD_TRACE_HOOKS")
            if _tracing:
                _undo_monitoring = pm.add_hookcall_monitoring(_trace_call, lambda *a: None)
            # registering backends is cheap (their modules came with the plugins):
            # do it now, so a plugin whose registration raises is reported at load
            _gather("precguard_register_backends", _backend_type, "device_type")
        finally:
            _loading = False
        _loaded = True
    return pm


def _trace_call(hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
    args = ", ".join(f"{k}={_short(v)}" for k, v in kwargs.items())
    _trace(f"{hook_name}({args}) asks [{', '.join(i.plugin_name for i in hook_impls)}]")


def builtin_name(module_name: str) -> str:
    """The plugin name of a built-in module: ``precguard.backends.cpu`` -> ``cpu``."""
    parts = module_name.split(".")
    return parts[-2] if parts[-1] == "builtin" and len(parts) > 1 else parts[-1]


def _record_load_error(name: str, cause: str, event: str = "plugin_load_failed") -> None:
    load_errors[name] = cause
    logger.error(event, plugin=name, cause=cause)
    if _tracing:
        _trace(f"  {name}: {cause}")


def _load_builtin(module_name: str) -> None:
    name = builtin_name(module_name)
    if pm.get_plugin(name) is None:
        try:
            module = importlib.import_module(module_name)
        except Exception as exc:  # a broken built-in must not take the others down
            _record_load_error(name, f"{type(exc).__name__}: {exc}")
        else:
            _register(module, PluginSource(name=name, builtin=True, module=module_name))


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
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken plugin must not take the others down
            _record_load_error(ep.name, f"{type(exc).__name__}: {exc}")
            continue
        source = PluginSource(
            ep.name, False, ep.value, getattr(dist, "name", None), getattr(dist, "version", None)
        )
        _register(plugin, source)


def _register(plugin: object, source: PluginSource) -> None:
    try:
        pm.register(plugin, name=source.name)
    except Exception as exc:  # pluggy validation: wrong hook signature and the like
        _record_load_error(source.name, f"{type(exc).__name__}: {exc}")
        return
    known = {n for n in dir(hookspecs) if n.startswith("precguard_")}
    for attr in dir(plugin):
        if attr.startswith("precguard_") and attr not in known and callable(getattr(plugin, attr)):
            why = "a typo, or written for another precguard version"
            source.warnings.append(f"implements unknown hook {attr!r} ({why})")
            logger.warning("plugin_unknown_hook", plugin=source.name, hook=attr)
    _sources[source.name] = source


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
        _registries.clear()
        load_errors.clear()
        _loaded = False


def sources() -> dict[str, PluginSource]:
    """Return where each registered plugin came from, by plugin name."""
    load_plugins()
    return dict(_sources)


# -- the registries the hooks fill ------------------------------------------------------


def _gather(
    hook_name: str, key_of: Callable[[Any], str], field_name: str
) -> dict[str, Registration]:
    """Ask each plugin's ``hook_name`` in pluggy's order; return what they registered, by key.

    pluggy asks the last registered (and ``tryfirst``) plugins first, so the
    first registration of a key wins and a later one is logged as displaced.
    A plugin whose implementation raises (or registers something ``key_of``
    refuses) is unregistered and listed in :data:`load_errors`, and nothing it
    registered is kept. The result is kept until the set of plugins changes
    (:attr:`PluginManager.generation`); do not modify it.
    """
    with _lock:
        cached = _registries.get(hook_name)
        if cached is not None and cached[0] == pm.generation:
            return cached[1]
        hook = getattr(pm.hook, hook_name)
        names = list(dict.fromkeys(i.plugin_name for i in reversed(hook.get_hookimpls())))
        found: dict[str, Registration] = {}
        for name in names:
            plugin = pm.get_plugin(name)
            others = [p for n, p in pm.list_name_plugin() if n != name]
            try:
                mine = _ask(pm.subset_hook_caller(hook_name, others), name, key_of)
            except Exception as exc:
                _drop_plugin(name, plugin, f"{hook_name} raised {type(exc).__name__}: {exc}")
                continue
            for key, item in mine.items():
                if key in found:
                    owner = found[key].plugin
                    logger.warning(
                        f"{field_name}_taken", **{field_name: key}, plugin=name, owner=owner
                    )
                    continue
                found[key] = Registration(item, name)
                if _tracing:
                    _trace(f"  {name} registers {field_name} {key!r}: {_short(item)}")
        _registries[hook_name] = (pm.generation, found)
        return found


def _ask(caller: Any, plugin: str, key_of: Callable[[Any], str]) -> dict[str, Any]:
    """Call one plugin's hook with a ``register`` bound to it; a ``register`` kept is refused."""
    mine: dict[str, Any] = {}
    open_ = True

    def register(item: Any) -> None:
        if not open_:
            raise RuntimeError(f"register() was called after {caller.name} returned")
        mine.setdefault(key_of(item), item)

    try:
        caller(register=register)
    finally:
        open_ = False
    return mine


def _drop_plugin(name: str, plugin: object, cause: str) -> None:
    """Unregister one plugin whose registration hook raised, and say so by name."""
    _record_load_error(name, cause, "plugin_registration_failed")
    if plugin is not None and pm.is_registered(plugin):
        pm.unregister(plugin=plugin, name=name)
    _sources.pop(name, None)


def _backend_type(backend_class: Any) -> str:
    if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
        raise TypeError(f"register() expects a Backend subclass, got {backend_class!r}")
    if not backend_class.device_type:
        raise TypeError(f"{backend_class.__name__} registers no device type (device_type is empty)")
    return backend_class.device_type


def _check_id(check: Any) -> str:
    if not isinstance(check, CheckLike) or isinstance(check, type):
        raise TypeError(f"register() expects a Check, got {check!r}")
    return check.id


def backends() -> dict[str, Registration]:
    """Return the registered backend classes by device type, with the plugin of each."""
    load_plugins()
    return dict(_gather("precguard_register_backends", _backend_type, "device_type"))


def collect_checks() -> dict[str, Any]:
    """Return every check (a ``precguard.checks.base.Check``) the plugins register, by check id.

    Plugins are asked in pluggy's order (the last registered first), so a
    plugin installed later can replace a check by registering the same id; the
    check it displaces is dropped with a ``check_taken`` warning naming both.
    """
    load_plugins()
    found = _gather("precguard_register_checks", _check_id, "check")
    return {check_id: entry.item for check_id, entry in found.items()}


def _switch_name(switch: Any) -> str:
    from precguard.backend import Switch

    if not isinstance(switch, Switch):
        raise TypeError(f"register() expects a precguard.Switch, got {switch!r}")
    return switch.name


def collect_switches(device: str | None = None) -> list[Any]:
    """Return the device switches plugins declare as remedies (``precguard.Switch``), in
    pluggy's order; with ``device``, only those that apply to it."""
    load_plugins()
    found = _gather("precguard_register_switches", _switch_name, "switch")
    switches = [entry.item for entry in found.values()]
    return [s for s in switches if device is None or s.applies_to(device)]


# -- what the rest of precguard asks of the registry -------------------------------------


def get_backend(device: str) -> Backend | None:
    """Return a backend for ``device`` (``"npu:1"``), usable or not; None if no plugin claims it."""
    load_plugins()
    registry = _gather("precguard_register_backends", _backend_type, "device_type")
    entry = registry.get(device.split(":", 1)[0])
    if _tracing:
        answer = (
            "no plugin claims it" if entry is None else f"{entry.item.__name__} ({entry.plugin})"
        )
        _trace(f"backend for {device!r}: {answer}")
    return None if entry is None else entry.item(device)


def device_types() -> dict[str, list[str]]:
    """Return the device types each plugin claims, by plugin name."""
    claimed: dict[str, list[str]] = {}
    for device_type, entry in backends().items():
        claimed.setdefault(entry.plugin, []).append(device_type)
    return {name: sorted(types) for name, types in claimed.items()}


def to_host(tensor: torch.Tensor) -> torch.Tensor:
    """Return a plain, contiguous CPU copy of ``tensor`` through its device's backend.

    A device no plugin claims gets :meth:`Backend.to_host`'s plain copy.
    """
    if tensor.device.type == "cpu":
        return tensor.detach().to("cpu", copy=True).contiguous()
    device = str(tensor.device)
    return (get_backend(device) or Backend(device)).to_host(tensor)


def fingerprint(device: str) -> dict[str, Any]:
    """Return the environment fingerprint of ``device``, sorted by key.

    torch's own facts (:func:`~precguard.backend.torch_facts`) for every
    device, then the backend's (:meth:`Backend.fingerprint`). A backend whose
    fingerprint raises is reported under ``fingerprint.error`` and logged: the
    fingerprint is evidence, so a broken one must be visible, not fatal.
    """
    facts = torch_facts()
    backend = get_backend(device)
    if backend is not None:
        try:
            facts.update(backend.fingerprint())
        except Exception as exc:
            cause = f"{type(backend).__name__}.fingerprint raised {type(exc).__name__}: {exc}"
            facts["fingerprint.error"] = cause
            logger.error("fingerprint_failed", device=device, cause=cause)
    return dict(sorted(facts.items()))


def describe() -> dict[str, Any]:
    """Return what ``precguard plugins --json`` prints: every plugin and every load error.

    Each plugin: name, built in or not, module, distribution, version, the
    device types and check ids it registers, its hooks and any warnings. Both
    registration hooks are asked first, so a plugin that breaks there is listed
    under ``load_errors``.
    """
    load_plugins()
    from precguard import __version__

    checks = _gather("precguard_register_checks", _check_id, "check")
    claimed = device_types()
    entries = [
        {
            "name": name,
            "builtin": src.builtin,
            "module": src.module,
            "distribution": src.distribution or ("precguard" if src.builtin else None),
            "version": src.version or (__version__ if src.builtin else None),
            "device_types": claimed.get(name, []),
            "checks": sorted(cid for cid, entry in checks.items() if entry.plugin == name),
            "hooks": sorted(c.name for c in (pm.get_hookcallers(plugin) or [])),
            "warnings": list(src.warnings),
        }
        for name, src in sorted(_sources.items(), key=lambda kv: (not kv[1].builtin, kv[0]))
        if (plugin := pm.get_plugin(name)) is not None
    ]
    errors = [{"name": n, "cause": c} for n, c in sorted(load_errors.items())]
    return {"schema_version": 1, "plugins": entries, "load_errors": errors}
