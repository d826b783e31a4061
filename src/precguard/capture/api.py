"""Public capture API: ``monitor``, ``recording``, ``precision_monitor``, ``unmonitor``.

``monitor`` and ``recording`` return a :class:`~precguard.capture.handle.Handle`;
``record`` is the deprecated old name of ``recording``.
"""

from __future__ import annotations

import functools
import itertools
import os
import warnings
import weakref
from collections.abc import Callable, Iterable
from typing import Any, TypeVar, overload

from torch import nn

from precguard import plugins
from precguard._logging import get_logger
from precguard.capture import collectives
from precguard.capture.active import ACTIVE as _ACTIVE
from precguard.capture.active import active_recording
from precguard.capture.active import pop as _pop
from precguard.capture.active import push as _push
from precguard.capture.compiled import (
    compiled_modules,
    drop_compiled_code,
    outside_dynamo,
    refusal,
)
from precguard.capture.flatten import named_tensors
from precguard.capture.handle import Handle
from precguard.capture.hooks import on_calls
from precguard.capture.monitor import Monitor
from precguard.capture.options import CaptureOptions, OnNonFinite
from precguard.capture.recording import Recording
from precguard.errors import NonFiniteError, UsageError

logger = get_logger(__name__)


def environment_fingerprint(device: str) -> dict[str, Any]:
    """The plugins' environment fingerprint of ``device`` for a manifest ({} if one fails).

    A recording is worth keeping even when a plugin cannot describe its
    device, so a failure is logged rather than raised.
    """
    try:
        return plugins.fingerprint(device)
    except Exception as exc:
        logger.warning("fingerprint_failed", device=device, error=f"{type(exc).__name__}: {exc}")
        return {}


_DECORATED: weakref.WeakKeyDictionary[nn.Module, Monitor] = weakref.WeakKeyDictionary()

T = TypeVar("T")


def capture_options(options: CaptureOptions | None = None, **overrides: Any) -> CaptureOptions:
    """``options`` (default: all defaults) with the keyword ``overrides`` applied, validated.

    What ``monitor``, ``record``, ``precision_monitor`` and ``record_target``
    do with their keyword arguments: an unknown name or a bad value is a
    pydantic ``ValidationError`` naming it. The fields set explicitly are
    those set in ``options`` plus the overrides (a decorator's explicit
    options win over a recording's, see :func:`effective_options`).

    >>> capture_options(CaptureOptions(tensors=True), backward=False)   # doctest: +SKIP
    CaptureOptions(tensors=True, backward=False, ...)
    """
    if options is None and not overrides:
        return CaptureOptions()
    if not overrides:
        return options  # type: ignore[return-value]
    given = options.model_dump(exclude_unset=True) if options is not None else {}
    return CaptureOptions.model_validate({**given, **overrides})


class MonitorHandle(Handle):
    """What :func:`monitor` returns: a :class:`~precguard.capture.handle.Handle`.

    >>> with precguard.monitor(model, out="runs/cpu") as mon:   # doctest: +SKIP
    ...     for batch in batches:
    ...         model(batch)
    ...         mon.step()
    """

    def __init__(self, monitor: Monitor, recording: Recording) -> None:
        super().__init__()
        self.hooks._add(monitor)  # the module and op hooks, removed before the close
        self.monitor = monitor
        self.recording = recording
        self._retraced: weakref.ref[nn.Module] | None = None  # set by monitor()
        self._pushed = recording.writer is not None
        if self._pushed:
            _open(recording)

    @property
    def path(self) -> os.PathLike[str] | None:
        """The recording directory (None when only watching)."""
        return self.recording.path

    def step(self) -> None:
        """End the current step; later captures belong to the next one."""
        self.recording.step()

    def remove(self, error: BaseException | None = None) -> None:
        """Remove every hook and close the recording. Idempotent.

        ``error``: the exception that ended the monitored code, if any; the
        manifest then says ``complete: false`` and names it (the context
        manager passes it for you).
        """
        try:
            self.hooks.remove()
        finally:
            _close(self.recording, error)
            retraced, self._retraced = self._retraced, None
            if retraced is not None and (model := retraced()) is not None:
                drop_compiled_code(model)  # recompiled without the hooks' graph breaks


def _open(recording: Recording) -> None:
    """Make ``recording`` the innermost active one; collectives record into it from now on."""
    _push(recording)
    collectives.install()


def _close(
    recording: Recording, error: BaseException | None, *, check_patterns: bool = False
) -> None:
    """Take ``recording`` off the active stack, unhook its decorated modules, close it.

    ``check_patterns``: warn about ``tensors`` globs that selected none of the
    decorated modules and functions that ran (``recording()``, which cannot know
    the names before they run).
    """
    if _pop(recording):
        collectives.uninstall()
    state = _IN_RECORDING.pop(recording, None)
    if check_patterns:
        _warn_unmatched_patterns(recording.options, state.names if state is not None else ())
    try:
        for _module, mon in state.monitors.values() if state is not None else ():
            mon.remove()
    finally:
        recording.close(error)


def monitor(
    model: nn.Module,
    out: str | os.PathLike[str] | None = None,
    options: CaptureOptions | None = None,
    *,
    overwrite: bool = False,
    device: str | None = None,
    target: str | None = None,
    fingerprint: dict[str, Any] | None = None,
    auto_step: bool = True,
    compute_dtype: str | None = None,
    **overrides: Any,
) -> MonitorHandle:
    """Instrument every submodule of ``model`` and record into ``out``.

    What to capture is a :class:`~precguard.capture.options.CaptureOptions`:
    pass one as ``options``, or its fields as keyword arguments (``tensors``,
    ``backward``, ``input_grads``, ``on_nonfinite``, ``params``; they override
    ``options``). An unknown option is an error, never a silent default.

    :param model: the root module; its name in keys is ``root``.
    :param out: recording directory (refused if non-empty unless ``overwrite``);
        None only watches for NaN/Inf and logs.
    :param options: what to capture (default: statistics of every module, forward and
        backward, parameters at the first step); see :class:`CaptureOptions`.
    :param overrides: fields of :class:`CaptureOptions`, e.g. ``tensors=["model.layers.3.*"]``
        (full tensors), ``on_nonfinite="raise"``, ``params="every_step"``.
    :param device: device string for the manifest (default: the model's device type).
    :param target: the target spec the run was made from, for the manifest.
    :param fingerprint: the environment fingerprint for the manifest (default:
        every plugin's facts for ``device``, as ``precguard env`` prints them).
    :param auto_step: each call of ``model`` starts a new step until ``handle.step()``
        is first called; False makes steps explicit from the start (several
        forwards per step, e.g. gradient accumulation).
    :param compute_dtype: the precision values are computed in when lower than the
        dtype they are stored in (an emulator, a vendor precision mode); compare
        judges the run by it. Autocast is detected per record without it.
    :raises UsageError: ``model`` (or a module in it) is already compiled with
        ``torch.compile``: monitor it before compiling (docs/capture.md).
    :returns: a :class:`MonitorHandle`; use it as a context manager so the
        hooks are removed also when the body raises. A body that raised leaves
        the recording ``complete: false`` with the exception's type.


    >>> with precguard.monitor(model, out="runs/golden"):   # doctest: +SKIP
    ...     model(input_ids)
    """
    options = capture_options(options, **overrides)
    compiled = compiled_modules(model)
    if compiled:
        raise UsageError(refusal(compiled))
    if device is None:
        first = next(itertools.chain(model.parameters(), model.buffers()), None)
        device = first.device.type if first is not None else "cpu"
    dtype = _model_dtype(model)
    if fingerprint is None and out is not None:
        fingerprint = environment_fingerprint(device)
    recording = Recording(
        out,
        options,
        overwrite=overwrite,
        device=device,
        dtype=dtype,
        model=type(model).__name__,
        target=target,
        fingerprint=fingerprint,
        auto_step=auto_step,
        compute_dtype=compute_dtype,
        to_host=plugins.to_host,
        fingerprint_of=environment_fingerprint,
    )
    retrace = retrace_compiled(model)
    mon = _module_and_op_hooks(model, recording, options)
    _warn_unmatched_patterns(options, mon.names.values())
    handle = MonitorHandle(mon, recording)
    handle._retraced = retrace
    return handle


def retrace_compiled(model: nn.Module) -> weakref.ref[nn.Module] | None:
    """Drop the code ``torch.compile`` made for ``model`` before its hooks (issue 37).

    A compiled wrapper warmed up before ``monitor(model)`` would run that code again
    without the hooks and record the root alone; dropped, its next call is retraced with
    them and every module is recorded (capture/compiled.py). Returns a reference to
    ``model`` when code was dropped (remove() drops the hooked code again, so the model
    recompiles without the graph breaks at its module boundaries), else None.
    """
    dropped = drop_compiled_code(model)
    if not dropped:
        return None
    logger.warning(
        "compiled_code_dropped",
        model=type(model).__name__,
        code=dropped,
        why="torch.compile ran this model before monitor(): its next compiled call is "
        "retraced with the hooks (docs/capture.md 'torch.compile')",
    )
    return weakref.ref(model)


def _module_and_op_hooks(model: nn.Module, recording: Recording, options: CaptureOptions) -> Any:
    """The hooks ``options.level`` asks for: a :class:`Monitor`, op capture, or both."""
    if options.level == "module":
        return Monitor(model, recording, options)
    from precguard.capture.ops import CaptureHooks, OpCapture

    modules = Monitor(model, recording, options) if options.level == "both" else None
    ops = OpCapture(model, recording, options, own_steps=modules is None)
    return CaptureHooks(modules, ops)  # it drops a None part


def _warn_unmatched_patterns(options: CaptureOptions, names: Iterable[str]) -> None:
    """Warn about each ``tensors`` glob that selects no module, naming the closest modules.

    A typo (``model.layer.3.*`` for ``model.layers.3.*``) would otherwise save
    nothing and surface only when compare has no full tensors to measure.
    """
    if isinstance(options.tensors, bool):
        return
    from precguard.suggest import closest

    names = list(names)
    for pattern in options.tensors:
        if any(options.saves_pattern(name, pattern) for name in names):
            continue
        stem = pattern.rstrip("*?.") or pattern
        logger.warning(
            "tensors_pattern_matches_nothing",
            pattern=pattern,
            closest=closest(stem, names, n=3, cutoff=0.3),
        )


def _model_dtype(model: nn.Module) -> str | None:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return None


class RecordingHandle(Handle):
    """What :func:`recording` returns: the open recording, a
    :class:`~precguard.capture.handle.Handle` (``remove()`` closes it)."""

    def __init__(self, recording: Recording) -> None:
        super().__init__()  # no hooks of its own: decorated modules hook themselves
        self.recording = recording
        self._removed = False
        _open(recording)

    @property
    def path(self) -> os.PathLike[str] | None:
        """The recording directory."""
        return self.recording.path

    def step(self) -> None:
        """End the current step."""
        self.recording.step()

    def remove(self, error: BaseException | None = None) -> None:
        """Close the recording and unhook the decorated modules that wrote into it. Idempotent.

        ``error``: the exception that ended the recorded code, if any (``with`` passes it):
        the manifest then says ``complete: false`` and names it.
        """
        if not self._removed:
            self._removed = True
            _close(self.recording, error, check_patterns=True)


def recording(
    out: str | os.PathLike[str],
    options: CaptureOptions | None = None,
    *,
    overwrite: bool = False,
    device: str | None = None,
    fingerprint: dict[str, Any] | None = None,
    auto_step: bool = True,
    compute_dtype: str | None = None,
    **overrides: Any,
) -> RecordingHandle:
    """Open a recording that ``@precision_monitor`` modules and functions write into.

    Options are those of :func:`monitor` (a :class:`CaptureOptions` and/or its
    fields as keyword arguments). The recording is active in the current
    context (thread or asyncio task) until the block ends. Decorated objects record only while
    a recording is open; outside one they only watch for NaN/Inf. The
    manifest's device (unless given), dtype, model and environment
    fingerprint come from the first decorated module (or function) called.
    When the body raises, the recording is closed ``complete: false`` with the
    exception's type, and the exception propagates. Without ``with``, call the
    handle's ``remove()`` to close it.

    >>> with precguard.recording("runs/npu") as rec:   # doctest: +SKIP
    ...     model(x)          # a @precision_monitor model
    """
    options = capture_options(options, **overrides)
    if options.level != "module":
        # op capture hooks a root module; recording() has none until decorated ones run
        logger.warning("op_level_needs_monitor", level=options.level, recorded="modules only")
    recording = Recording(
        out,
        options,
        overwrite=overwrite,
        device=device,
        fingerprint=fingerprint,
        auto_step=auto_step,
        compute_dtype=compute_dtype,
        to_host=plugins.to_host,
        fingerprint_of=environment_fingerprint,
    )
    return RecordingHandle(recording)


def record(*args: Any, **kwargs: Any) -> RecordingHandle:
    """Deprecated: the old name of :func:`recording` (``precguard record`` on the command
    line is :func:`precguard.record_target`); it warns and opens the same recording."""
    warnings.warn(
        "precguard.record is deprecated: use precguard.recording (the same context manager)",
        DeprecationWarning,
        stacklevel=2,
    )
    return recording(*args, **kwargs)


class _WatchSinks:
    """The sink of a decorated object: the active recording, else a watch-only one.

    ``only_when_idle``: return the watch-only sink only while no recording is
    open, and None while one is (a decorated class's instances get their own
    hooks in each recording, see :func:`_hook_instance`).
    """

    def __init__(self, options: CaptureOptions, *, only_when_idle: bool = False) -> None:
        self.options = options
        self.only_when_idle = only_when_idle
        self._watch: Recording | None = None
        self._last: Recording | None = None  # the recording last written into

    def __call__(self) -> Recording | None:
        rec = active_recording()
        if rec is None and self._last is not None and not self._last.closed:
            # a context that never opened a recording while the last one we wrote into is
            # still open: an autograd worker thread running this module's backward
            rec = self._last
        if rec is not None:
            self._last = rec
            return None if self.only_when_idle else rec
        if self._watch is None:
            self._watch = Recording(None, self.options)
        return self._watch


class _RecordingDecorations:
    """What decorated classes hooked into one open recording, and the names they got."""

    def __init__(self) -> None:
        self.monitors: dict[int, tuple[nn.Module, Monitor]] = {}  # id(instance) -> hooks
        self.counts: dict[str, int] = {}
        self.names: set[str] = set()  # every module and function name recorded

    def add(self, rec: Recording, module: nn.Module, options: CaptureOptions, name: str) -> None:
        """Hook ``module`` into ``rec`` as ``name``; it and its submodules count as covered.

        The hooks write only while ``rec`` is the innermost open recording, as
        every decorated object does.
        """
        mon = Monitor(module, functools.partial(_if_innermost, rec), options, root_name=name)
        rec.covered.update(id(m) for m in mon.names)
        self.names.update(mon.names.values())
        self.monitors[id(module)] = (module, mon)

    def drop(self, rec: Recording, key: int) -> None:
        """Remove the hooks of the instance ``key`` (its id) from ``rec``."""
        _module, mon = self.monitors.pop(key)
        mon.remove()
        rec.covered.difference_update(id(m) for m in mon.names)

    def name_for(self, module: nn.Module, explicit: str | None) -> str:
        """``Class#i`` by first call in this recording; an explicit name bare, then ``name#i``."""
        base = explicit or type(module).__name__
        n = self.counts.get(base, 0)
        self.counts[base] = n + 1
        return base if explicit and n == 0 else f"{base}#{n}"


def _if_innermost(rec: Recording) -> Recording | None:
    """``rec`` while it is the innermost recording of this context.

    A context with no recording at all (an autograd worker thread running the
    backward of a forward recorded into ``rec``) still writes into ``rec``
    while it is open: its hooks exist only for it and go when it closes.
    """
    stack = _ACTIVE.get()
    if stack:
        return rec if stack[-1] is rec else None
    return None if rec.closed else rec


#: per open recording: the instances of decorated classes recorded into it
_IN_RECORDING: weakref.WeakKeyDictionary[Recording, _RecordingDecorations] = (
    weakref.WeakKeyDictionary()
)


def _decorations(rec: Recording) -> _RecordingDecorations:
    state = _IN_RECORDING.get(rec)
    if state is None:
        state = _IN_RECORDING[rec] = _RecordingDecorations()
    return state


class _ClassDecoration:
    """How a decorated class was changed (to undo it) and its watch-only hooks."""

    def __init__(self, cls: type[nn.Module], opts: CaptureOptions, name: str | None) -> None:
        self.cls = cls
        self.options = opts
        self.name = name
        self.own_call = cls.__dict__.get("__call__")  # None: inherited, undo by deleting
        self.watchers: weakref.WeakKeyDictionary[nn.Module, Monitor] = weakref.WeakKeyDictionary()


_DECORATED_CLASSES: dict[type, _ClassDecoration] = {}


def _attach(module: nn.Module, options: CaptureOptions, name: str) -> Monitor:
    mon = _DECORATED.get(module)
    if mon is None:
        mon = Monitor(module, _WatchSinks(options), options, root_name=name, covers=False)
        _DECORATED[module] = mon
    return mon


def _note_facts(recording: Recording, module: nn.Module) -> None:
    """Give ``recording`` the device, dtype and model class it was opened without."""
    first = next(itertools.chain(module.parameters(), module.buffers()), None)
    recording.fill_facts(
        device=first.device.type if first is not None else None,
        dtype=_model_dtype(module),
        model=type(module).__name__,
    )


def _hook_instance(module: nn.Module, deco: _ClassDecoration) -> None:
    """Make sure the instance of a decorated class being called is recorded (or watched).

    In an open recording each instance gets hooks of its own, named in that
    recording: its path under an enclosing decorated or monitored root (which
    then records it), else ``name=``, else ``Class#i`` by first call in the
    recording, so two runs in one process give the same keys. The hooks go
    when the recording closes. With no recording open, watch-only hooks look
    for NaN/Inf.
    """
    rec = active_recording()
    if rec is None:
        if module not in deco.watchers:
            deco.watchers[module] = Monitor(
                module,
                _WatchSinks(deco.options, only_when_idle=True),
                deco.options,
                root_name=deco.name or type(module).__name__,
                covers=False,
            )
        return
    state = _decorations(rec)
    if id(module) in state.monitors or id(module) in rec.covered:
        return
    if rec.missing_facts:
        _note_facts(rec, module)
    # instances called on their own before, now inside this one, are recorded
    # under their path here from now on, not twice
    inside = {id(m) for m in module.modules()}
    for key in [k for k in state.monitors if k in inside]:
        state.drop(rec, key)
    options = effective_options(rec.options, deco.options)
    state.add(rec, module, options, state.name_for(module, deco.name))


#: under torch.compile, attaching hooks is a graph break, never traced (capture/compiled.py)
_hook_instance_outside_dynamo = outside_dynamo(_hook_instance)


def effective_options(recording: CaptureOptions, decorator: CaptureOptions) -> CaptureOptions:
    """The options a decorated object records with: the recording's, except those the
    decorator set explicitly.

    ``record(out, tensors=True)`` then saves the tensors of a bare
    ``@precision_monitor`` class (what the manifest's ``options`` say), while
    ``@precision_monitor(on_nonfinite="raise")`` keeps raising in any recording.
    """
    explicit = {name: getattr(decorator, name) for name in decorator.model_fields_set}
    return recording.model_copy(update=explicit) if explicit else recording


@overload
def precision_monitor(obj: T) -> T: ...
@overload
def precision_monitor(
    obj: None = None,
    *,
    name: str | None = None,
    options: CaptureOptions | None = None,
    **overrides: Any,
) -> Callable[[T], T]: ...


def precision_monitor(
    obj: Any = None,
    *,
    name: str | None = None,
    options: CaptureOptions | None = None,
    **overrides: Any,
) -> Any:
    """Instrument a module class, a module instance, or a function.

    Bare or with the options of :func:`monitor` (a :class:`CaptureOptions`
    as ``options``, and/or its fields: ``tensors``, ``backward``,
    ``on_nonfinite``, ``params``). The options set explicitly here win over
    the recording's; the others follow the recording. Decorated objects write into the active
    :func:`record` (or :func:`monitor`) recording; with none open they only
    watch for NaN/Inf and log the origin.

    - On an ``nn.Module`` subclass: every instance is instrumented at its
      first call in each recording. Its records are named by its path under an
      enclosing decorated or monitored module when there is one, else by
      ``name`` (then ``name#1``, ... for further instances), else
      ``ClassName#i`` in order of first call *in that recording* — so two
      recordings made in one process line up. :func:`unmonitor` on the class
      undoes the decoration.
    - On an instance: instrumented now, named ``name`` (default ``root``);
      :func:`unmonitor` removes the hooks.
    - On a function: its tensor arguments and results are recorded as a
      pseudo-module named after the function (or ``name``).

    >>> @precguard.precision_monitor(on_nonfinite="raise")   # doctest: +SKIP
    ... class MyAttention(nn.Module): ...
    """
    opts = capture_options(options, **overrides)
    if obj is None:
        return functools.partial(_decorate, opts=opts, name=name)
    return _decorate(obj, opts=opts, name=name)


def _decorate(obj: Any, *, opts: CaptureOptions, name: str | None) -> Any:
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        return _decorate_class(obj, opts, name)
    if isinstance(obj, nn.Module):
        retrace_compiled(obj)  # an instance a warm compiled wrapper runs (issue 37)
        _attach(obj, opts, name or "root")
        if obj not in _FACT_HOOKS:
            _FACT_HOOKS[obj] = on_calls(
                obj, _fill_facts_hook, modules=lambda _n, m: m is obj, with_kwargs=False
            )
        return obj
    if callable(obj):
        return _decorate_function(obj, opts, name)
    raise TypeError(
        f"precision_monitor: expected an nn.Module subclass, instance or a function, "
        f"got {type(obj).__name__}"
    )


#: decorated instances -> the pre-hook that tells an open recording the model's facts
_FACT_HOOKS: weakref.WeakKeyDictionary[nn.Module, Any] = weakref.WeakKeyDictionary()


def _fill_facts_hook(_name: str, module: nn.Module, args: Any) -> None:
    rec = active_recording()
    if rec is not None and rec.missing_facts:
        try:
            _note_facts(rec, module)
        except Exception as exc:
            logger.error("hook_failed", module=type(module).__name__, hook="facts", error=str(exc))


def _decorate_class(
    cls: type[nn.Module], opts: CaptureOptions, name: str | None
) -> type[nn.Module]:
    if cls in _DECORATED_CLASSES:
        return cls
    deco = _ClassDecoration(cls, opts, name)
    inherited_call = cls.__call__

    @functools.wraps(inherited_call)
    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        # Hooks go on at the call, when every submodule exists (also those a
        # subclass adds after our __init__ ran). An instance decorated on its
        # own keeps its own hooks and name.
        if self not in _DECORATED:
            try:
                _hook_instance_outside_dynamo(self, deco)
            except Exception as exc:
                logger.error(
                    "hook_failed", module=type(self).__name__, hook="attach", error=str(exc)
                )
        return inherited_call(self, *args, **kwargs)

    cls.__call__ = __call__  # type: ignore[method-assign]
    _DECORATED_CLASSES[cls] = deco
    return cls


def _undecorate_class(cls: type) -> bool:
    deco = _DECORATED_CLASSES.pop(cls, None)
    if deco is None:
        return False
    if deco.own_call is None:
        del cls.__call__
    else:
        cls.__call__ = deco.own_call  # type: ignore[method-assign]
    for mon in list(deco.watchers.values()):
        mon.remove()
    deco.watchers.clear()
    for rec, state in list(_IN_RECORDING.items()):
        for key, (module, _mon) in list(state.monitors.items()):
            if isinstance(module, cls):
                state.drop(rec, key)
    return True


def _decorate_function(
    fn: Callable[..., Any], opts: CaptureOptions, name: str | None
) -> Callable[..., Any]:
    label = name or getattr(fn, "__qualname__", getattr(fn, "__name__", "function"))
    sinks = _WatchSinks(opts)
    # per sink: (save full tensors?, on_nonfinite) under that recording's options
    policies: weakref.WeakKeyDictionary[Recording, tuple[bool, OnNonFinite]] = (
        weakref.WeakKeyDictionary()
    )

    def policy(sink: Recording) -> tuple[bool, OnNonFinite]:
        found = policies.get(sink)
        if found is None:
            eff = effective_options(sink.options, opts)
            found = policies[sink] = (eff.saves(label), eff.on_nonfinite)
            if sink.writer is not None:
                _decorations(sink).names.add(label)
        return found

    @outside_dynamo
    def start(args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Recording, Any] | None:
        sink = sinks()
        if sink is None:  # not with these sinks; keeps the type checker honest
            return None
        try:
            items = named_tensors(args, "args") + named_tensors(kwargs, "kwargs")
            if sink.missing_facts - {"model"}:
                _note_tensor_facts(sink, items)
            save, on_nonfinite = policy(sink)
            frame = sink.enter(
                wrapper,
                label,
                "function",
                items,
                root=False,
                save=save,
                on_nonfinite=on_nonfinite,
            )
        except Exception as exc:
            logger.error("hook_failed", module=label, hook="function_pre", error=str(exc))
            return None
        return sink, frame

    @outside_dynamo
    def finish(started: tuple[Recording, Any], result: Any) -> None:
        sink, frame = started
        try:
            sink.leave(frame, named_tensors(result, "output"))
            if sink.writer is None:
                sink.flush()  # watch-only: scan for NaN/Inf now, nothing is written
        except NonFiniteError:
            raise
        except Exception as exc:
            logger.error("hook_failed", module=label, hook="function", error=str(exc))

    # the recording parts run outside dynamo's tracing (capture/compiled.py): in a
    # compiled region each is a graph break, the function itself is traced as usual
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = start(args, kwargs)
        result = fn(*args, **kwargs)
        if started is not None:
            finish(started, result)
        return result

    return wrapper


def _note_tensor_facts(recording: Recording, items: list[tuple[str, Any]]) -> None:
    """Device and dtype of a decorated function's first floating-point argument."""
    for _name, t in items:
        if t.is_floating_point():
            recording.fill_facts(
                device=t.device.type, dtype=str(t.dtype).removeprefix("torch."), model=None
            )
            return


def unmonitor(obj: nn.Module | type[nn.Module]) -> bool:
    """Undo :func:`precision_monitor`; True if there was something to undo.

    On an instance: remove its hooks. On a decorated class: restore the class
    as it was and remove the hooks of its instances.
    """
    if isinstance(obj, type):
        return _undecorate_class(obj)
    fact_hook = _FACT_HOOKS.pop(obj, None)
    if fact_hook is not None:
        fact_hook.remove()
    mon = _DECORATED.pop(obj, None)
    if mon is None:
        return False
    mon.remove()
    return True
