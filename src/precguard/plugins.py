"""The plugin manager: built-in plugins plus lazily loaded entry points.

Built-in plugins (:data:`DEFAULT_PLUGINS`) are plain modules registered
exactly like third-party plugins, which arrive through the ``precguard``
entry-point group. Nothing is imported until the first call that needs a
plugin (:func:`load_plugins` is lazy and idempotent).

Plugins only register things (:mod:`precguard.hookspecs`): backend classes
and checks. precguard asks for them with a plain ``pm.hook.*`` call, so hook
wrappers, ``tryfirst``/``trylast`` and hook-call monitoring behave as pluggy
documents; what a device does lives on its :class:`~precguard.backend.Backend`.

Environment variables:

``PRECGUARD_DISABLE_PLUGIN_AUTOLOAD=1``
    load no entry-point plugins (built-ins only).
``PRECGUARD_PLUGINS=cuda,ascend``
    load only these entry-point plugins (by entry-point name).
``PRECGUARD_TRACE_HOOKS=1``
    write every hook call to stderr: which plugins were asked, and what each
    one registered.

A plugin that fails to import or register, or whose registration hook
raises, is recorded in :data:`load_errors` (name -> cause), logged and left
out; the other plugins keep working.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from types import CodeType
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


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, counting changes to the set of plugins.

    The registries the hooks fill are kept until the set changes (a plugin
    registered or unregistered, by precguard or directly on :data:`pm`), so a
    lookup such as :func:`get_backend` costs a dict access, not a hook call.
    """

    #: bumped by every register/unregister
    generation: int = 0

    def register(self, plugin: object, name: str | None = None) -> str | None:
        """Register ``plugin`` (see pluggy) and mark the registries stale."""
        try:
            return super().register(plugin, name)
        finally:
            self.generation += 1

    def unregister(self, plugin: object | None = None, name: str | None = None) -> Any:
        """Unregister ``plugin`` or ``name`` (see pluggy) and mark the registries stale."""
        try:
            return super().unregister(plugin, name)
        finally:
            self.generation += 1


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
            _tracing = _env_on("PRECGUARD_TRACE_HOOKS")
            if _tracing:
                _undo_monitoring = pm.add_hookcall_monitoring(_trace_before, _trace_after)
            # registering backends is cheap (their modules came with the plugins):
            # do it now, so a plugin whose registration raises is reported at load
            _gather("precguard_register_backends", _backend_type, "device_type")
        finally:
            _loading = False
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
                f"implements unknown hook {attr!r} "
                "(a typo, or written for another precguard version)"
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
        _registries.clear()
        load_errors.clear()
        _loaded = False


def sources() -> dict[str, PluginSource]:
    """Return where each registered plugin came from, by plugin name."""
    load_plugins()
    return dict(_sources)


# -- the registries the hooks fill ------------------------------------------------------


@dataclass(frozen=True)
class Registration:
    """One thing a plugin registered: a backend class or a check, and the plugin's name."""

    item: Any
    plugin: str


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


def _impl_owners(hook_name: str) -> dict[CodeType, str]:
    """The code object of every implementation of ``hook_name`` (wrappers too) -> its plugin."""
    caller = getattr(pm.hook, hook_name)
    return {impl.function.__code__: impl.plugin_name for impl in caller.get_hookimpls()}


def _plugin_on_stack(owners: dict[CodeType, str]) -> str:
    """The plugin whose hook implementation is running below the caller of ``register``.

    One ``pm.hook`` call asks every plugin with the same ``register``; the
    running implementation's frame says which plugin is registering (also when
    it calls ``register`` from a helper function of its own).
    """
    frame = sys._getframe(2)
    while frame is not None:
        plugin = owners.get(frame.f_code)
        if plugin is not None:
            return plugin
        frame = frame.f_back
    return "?"


def _plugin_in_traceback(exc: BaseException, owners: dict[CodeType, str]) -> str | None:
    """The plugin whose hook implementation raised ``exc`` (the innermost one), or None."""
    culprit = None
    tb = exc.__traceback__
    while tb is not None:
        culprit = owners.get(tb.tb_frame.f_code, culprit)
        tb = tb.tb_next
    return culprit


def _drop_plugin(name: str, hook_name: str, exc: BaseException) -> None:
    """Unregister a plugin whose registration hook raised, and say so by name."""
    with _lock:
        load_errors[name] = f"{hook_name} raised {type(exc).__name__}: {exc}"
        logger.error("plugin_registration_failed", plugin=name, cause=load_errors[name])
        if pm.get_plugin(name) is not None:
            pm.unregister(name=name)
        _sources.pop(name, None)


#: hook name -> (pm.generation it was built at, what the hook registered)
_registries: dict[str, tuple[int, dict[str, Registration]]] = {}


def _gather(
    hook_name: str, key_of: Callable[[Any], str], field_name: str
) -> dict[str, Registration]:
    """Call the registration hook ``hook_name`` through pluggy; return what it registered, by key.

    pluggy asks the last registered (and ``tryfirst``) plugins first, so the
    first registration of a key wins and a later one is logged as displaced.
    A plugin whose implementation raises is unregistered and listed in
    :data:`load_errors`, and the hook is asked again without it: one broken
    plugin never takes the others down. The result is kept until the set of
    plugins changes (:attr:`PluginManager.generation`); do not modify it.
    """
    cached = _registries.get(hook_name)
    if cached is not None and cached[0] == pm.generation:
        return cached[1]
    while True:
        generation = pm.generation
        owners = _impl_owners(hook_name)
        try:
            found = _ask(hook_name, key_of, field_name, owners)
        except Exception as exc:
            culprit = _plugin_in_traceback(exc, owners)
            if culprit is None:
                raise
            _drop_plugin(culprit, hook_name, exc)
            continue
        _registries[hook_name] = (generation, found)
        return found


def _ask(
    hook_name: str,
    key_of: Callable[[Any], str],
    field_name: str,
    owners: dict[CodeType, str],
) -> dict[str, Registration]:
    """Call ``hook_name`` once; a ``register`` kept and called later is refused."""
    found: dict[str, Registration] = {}
    open_ = True

    def register(item: Any) -> None:
        if not open_:
            raise RuntimeError(f"register() was called after {hook_name} returned")
        plugin = _plugin_on_stack(owners)
        key = key_of(item)
        if key in found:
            owner = found[key].plugin
            logger.warning(f"{field_name}_taken", **{field_name: key}, plugin=plugin, owner=owner)
            return
        found[key] = Registration(item, plugin)
        if _tracing:
            _trace(f"  {plugin} registers {field_name} {key!r}: {_short(item)}")

    try:
        getattr(pm.hook, hook_name)(register=register)
    finally:
        open_ = False
    return found


def _backend_type(backend_class: Any) -> str:
    from precguard.backend import Backend

    if not (isinstance(backend_class, type) and issubclass(backend_class, Backend)):
        raise TypeError(f"register() expects a Backend subclass, got {backend_class!r}")
    if not backend_class.device_type:
        raise TypeError(f"{backend_class.__name__} registers no device type (device_type is empty)")
    return backend_class.device_type


def _check_id(check: Any) -> str:
    from precguard.checks.base import Check

    if not isinstance(check, Check):
        raise TypeError(f"register() expects a Check, got {check!r}")
    return check.id


def backends() -> dict[str, Registration]:
    """Return the registered backend classes by device type, with the plugin of each."""
    load_plugins()
    return dict(_gather("precguard_register_backends", _backend_type, "device_type"))


def collect_checks() -> dict[str, Check]:
    """Return every check the plugins register, by check id.

    Plugins are asked in pluggy's order (the last registered first), so a
    plugin installed later can replace a check by registering the same id; the
    check it displaces is dropped with a ``check_taken`` warning naming both.
    """
    load_plugins()
    found = _gather("precguard_register_checks", _check_id, "check")
    return {check_id: entry.item for check_id, entry in found.items()}


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
    from precguard.backend import Backend

    device = str(tensor.device)
    return (get_backend(device) or Backend(device)).to_host(tensor)


def fingerprint(device: str) -> dict[str, Any]:
    """Return the environment fingerprint of ``device``, sorted by key.

    torch's own facts (:func:`~precguard.backend.torch_facts`) for every
    device, then the backend's (:meth:`Backend.fingerprint`). A backend whose
    fingerprint raises is reported under ``fingerprint.error`` and logged: the
    fingerprint is evidence, so a broken one must be visible, not fatal.
    """
    from precguard.backend import torch_facts

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

    Each plugin entry has its name, whether it is built in, its module,
    distribution and version, the device types and check ids it registers, the
    hooks it implements and any warnings found while registering it. Both
    registration hooks are asked first, so a plugin that breaks there is
    listed under ``load_errors``.
    """
    load_plugins()
    from precguard import __version__

    checks = _gather("precguard_register_checks", _check_id, "check")
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
                "checks": sorted(cid for cid, entry in checks.items() if entry.plugin == name),
                "hooks": hooks,
                "warnings": list(source.warnings),
            }
        )
    errors = [{"name": n, "cause": c} for n, c in sorted(load_errors.items())]
    return {"schema_version": 1, "plugins": entries, "load_errors": errors}
