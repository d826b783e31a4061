"""Public capture API: ``monitor``, ``record``, ``precision_monitor``, ``unmonitor``."""

from __future__ import annotations

import functools
import itertools
import os
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, overload

from torch import nn

from precguard._logging import get_logger
from precguard.capture.flatten import named_tensors
from precguard.capture.monitor import Monitor
from precguard.capture.options import CaptureOptions
from precguard.capture.recording import Recording
from precguard.errors import NonFiniteError

logger = get_logger(__name__)

_ACTIVE: list[Recording] = []
_DECORATED: weakref.WeakKeyDictionary[nn.Module, Monitor] = weakref.WeakKeyDictionary()
_INSTANCE_COUNTERS: dict[type, itertools.count] = {}

T = TypeVar("T")


def active_recording() -> Recording | None:
    """Return the innermost open recording (``record`` or ``monitor`` with ``out``), or None."""
    return _ACTIVE[-1] if _ACTIVE else None


class MonitorHandle:
    """What :func:`monitor` returns: steps, removal, and context-manager use.

    >>> with precguard.monitor(model, out="runs/cpu") as mon:   # doctest: +SKIP
    ...     for batch in batches:
    ...         model(batch)
    ...         mon.step()
    """

    def __init__(self, monitor: Monitor, recording: Recording) -> None:
        self.monitor = monitor
        self.recording = recording
        self._pushed = recording.writer is not None
        if self._pushed:
            _ACTIVE.append(recording)

    @property
    def path(self) -> os.PathLike[str] | None:
        """The recording directory (None when only watching)."""
        return self.recording.path

    def step(self) -> None:
        """End the current step; later captures belong to the next one."""
        self.recording.step()

    def remove(self) -> None:
        """Remove every hook and close the recording. Idempotent."""
        try:
            self.monitor.remove()
        finally:
            if self._pushed and self.recording in _ACTIVE:
                _ACTIVE.remove(self.recording)
            self.recording.close()

    def __enter__(self) -> MonitorHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


def monitor(
    model: nn.Module,
    out: str | os.PathLike[str] | None = None,
    *,
    tensors: bool | list[str] = False,
    backward: bool = True,
    input_grads: bool = True,
    on_nonfinite: str = "record",
    params: str = "first_step",
    overwrite: bool = False,
    device: str | None = None,
    target: str | None = None,
    fingerprint: dict[str, Any] | None = None,
    auto_step: bool = True,
    compute_dtype: str | None = None,
) -> MonitorHandle:
    """Instrument every submodule of ``model`` and record into ``out``.

    :param model: the root module; its name in keys is ``root``.
    :param out: recording directory (refused if non-empty unless ``overwrite``);
        None only watches for NaN/Inf and logs.
    :param tensors: save full tensors: True for all modules, or glob patterns.
    :param backward: record gradients of module outputs and parameters.
    :param input_grads: with ``backward``, also record gradients w.r.t. module inputs
        (``backward.input`` records; see docs/capture.md for what they mean and cost).
    :param on_nonfinite: ``"record"``, ``"save"`` (write the origin's inputs)
        or ``"raise"`` (:class:`~precguard.errors.NonFiniteError` at the origin).
    :param params: parameter statistics at ``"first_step"``, ``"every_step"`` or ``"never"``.
    :param device: device string for the manifest (default: the model's device type).
    :param auto_step: each call of ``model`` starts a new step until ``handle.step()``
        is first called; False makes steps explicit from the start (several
        forwards per step, e.g. gradient accumulation).
    :param compute_dtype: the precision values are computed in when lower than the
        dtype they are stored in (an emulator, a vendor precision mode); compare
        judges the run by it. Autocast is detected per record without it.
    :returns: a :class:`MonitorHandle`; use it as a context manager so the
        hooks are removed also when the body raises.


    >>> with precguard.monitor(model, out="runs/golden"):   # doctest: +SKIP
    ...     model(input_ids)
    """
    options = CaptureOptions(
        tensors=tensors,
        backward=backward,
        input_grads=input_grads,
        on_nonfinite=on_nonfinite,
        params=params,
    )
    if device is None:
        first = next(itertools.chain(model.parameters(), model.buffers()), None)
        device = first.device.type if first is not None else "cpu"
    dtype = _model_dtype(model)
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
    )
    return MonitorHandle(Monitor(model, recording, options), recording)


def _model_dtype(model: nn.Module) -> str | None:
    for p in model.parameters():
        if p.is_floating_point():
            return str(p.dtype).removeprefix("torch.")
    return None


class RecordingHandle:
    """What :func:`record` yields: the open recording with explicit steps."""

    def __init__(self, recording: Recording) -> None:
        self.recording = recording

    @property
    def path(self) -> os.PathLike[str] | None:
        """The recording directory."""
        return self.recording.path

    def step(self) -> None:
        """End the current step."""
        self.recording.step()


@contextmanager
def record(
    out: str | os.PathLike[str],
    *,
    tensors: bool | list[str] = False,
    backward: bool = True,
    input_grads: bool = True,
    on_nonfinite: str = "record",
    params: str = "first_step",
    overwrite: bool = False,
    device: str = "cpu",
    fingerprint: dict[str, Any] | None = None,
    auto_step: bool = True,
    compute_dtype: str | None = None,
) -> Iterator[RecordingHandle]:
    """Open a recording that ``@precision_monitor`` modules and functions write into.

    Options are those of :func:`monitor`. Decorated objects record only while
    a recording is open; outside one they only watch for NaN/Inf.

    >>> with precguard.record("runs/npu") as rec:   # doctest: +SKIP
    ...     model(x)          # a @precision_monitor model
    """
    options = CaptureOptions(
        tensors=tensors,
        backward=backward,
        input_grads=input_grads,
        on_nonfinite=on_nonfinite,
        params=params,
    )
    recording = Recording(
        out,
        options,
        overwrite=overwrite,
        device=device,
        fingerprint=fingerprint,
        auto_step=auto_step,
        compute_dtype=compute_dtype,
    )
    _ACTIVE.append(recording)
    try:
        yield RecordingHandle(recording)
    finally:
        if recording in _ACTIVE:
            _ACTIVE.remove(recording)
        recording.close()


class _WatchSinks:
    """Watch-only sinks (no directory) for decorated objects outside any recording."""

    def __init__(self, options: CaptureOptions) -> None:
        self.options = options
        self._watch: Recording | None = None

    def __call__(self) -> Recording:
        rec = active_recording()
        if rec is not None:
            return rec
        if self._watch is None:
            self._watch = Recording(None, self.options)
        return self._watch


def _attach(module: nn.Module, options: CaptureOptions, name: str) -> Monitor:
    mon = _DECORATED.get(module)
    if mon is None:
        mon = Monitor(module, _WatchSinks(options), options, root_name=name, covers=False)
        _DECORATED[module] = mon
    return mon


@overload
def precision_monitor(obj: T) -> T: ...
@overload
def precision_monitor(
    obj: None = None, *, name: str | None = None, **options: Any
) -> Callable[[T], T]: ...


def precision_monitor(obj: Any = None, *, name: str | None = None, **options: Any) -> Any:
    """Instrument a module class, a module instance, or a function.

    Bare or with the options of :func:`monitor` (``tensors``, ``backward``,
    ``on_nonfinite``, ``params``). Decorated objects write into the active
    :func:`record` (or :func:`monitor`) recording; with none open they only
    watch for NaN/Inf and log the origin.

    - On an ``nn.Module`` subclass: every instance is instrumented at its
      first call; instances are named ``ClassName#i`` in creation order.
    - On an instance: instrumented now, named ``name`` (default ``root``);
      :func:`unmonitor` removes the hooks.
    - On a function: its tensor arguments and results are recorded as a
      pseudo-module named after the function.

    >>> @precguard.precision_monitor(on_nonfinite="raise")   # doctest: +SKIP
    ... class MyAttention(nn.Module): ...
    """
    opts = CaptureOptions(**options)
    if obj is None:
        return functools.partial(_decorate, opts=opts, name=name)
    return _decorate(obj, opts=opts, name=name)


def _decorate(obj: Any, *, opts: CaptureOptions, name: str | None) -> Any:
    if isinstance(obj, type) and issubclass(obj, nn.Module):
        return _decorate_class(obj, opts)
    if isinstance(obj, nn.Module):
        _attach(obj, opts, name or "root")
        return obj
    if callable(obj):
        return _decorate_function(obj, opts, name)
    raise TypeError(
        f"precision_monitor: expected an nn.Module subclass, instance or a function, "
        f"got {type(obj).__name__}"
    )


def _decorate_class(cls: type[nn.Module], opts: CaptureOptions) -> type[nn.Module]:
    original_call = cls.__call__
    counter = _INSTANCE_COUNTERS.setdefault(cls, itertools.count())
    instance_names: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary()

    @functools.wraps(original_call)
    def __call__(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        # Attach at the first call, when every submodule exists (also those a
        # subclass adds after our __init__ ran).
        if self not in _DECORATED:
            if self not in instance_names:
                instance_names[self] = f"{type(self).__name__}#{next(counter)}"
            _attach(self, opts, instance_names[self])
        return original_call(self, *args, **kwargs)

    cls.__call__ = __call__  # type: ignore[method-assign]
    return cls


def _decorate_function(
    fn: Callable[..., Any], opts: CaptureOptions, name: str | None
) -> Callable[..., Any]:
    label = name or getattr(fn, "__qualname__", getattr(fn, "__name__", "function"))
    sinks = _WatchSinks(opts)
    save = opts.saves(label)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sink = sinks()
        try:
            items = named_tensors(args, "args") + named_tensors(kwargs, "kwargs")
            frame = sink.enter(
                wrapper,
                label,
                "function",
                items,
                root=False,
                save=save,
                on_nonfinite=opts.on_nonfinite,
            )
        except Exception as exc:
            logger.error("hook_failed", module=label, hook="function_pre", error=str(exc))
            return fn(*args, **kwargs)
        result = fn(*args, **kwargs)
        try:
            sink.leave(frame, named_tensors(result, "output"))
            if sink.writer is None:
                sink.flush()  # watch-only: scan for NaN/Inf now, nothing is written
        except NonFiniteError:
            raise
        except Exception as exc:
            logger.error("hook_failed", module=label, hook="function", error=str(exc))
        return result

    return wrapper


def unmonitor(module: nn.Module) -> bool:
    """Remove hooks added by :func:`precision_monitor` from ``module``; True if there were any."""
    mon = _DECORATED.pop(module, None)
    if mon is None:
        return False
    mon.remove()
    return True
