"""``precguard.watch``: a training monitor cheap enough to stay on for the whole run.

Every step costs a few on-device reductions and one small transfer
(:mod:`precguard.training.pulse`), and, unless the loop hands over the norm
its gradient clipping computed (``step(loss, grad_norm=norm)``), one pass over
the gradients for their norms; every ``every``-th step (and, with
``on_alert="record"``, the step after an alert) is recorded in full into
``OUT/recording/`` in the recording format, so ``compare``, ``replay`` and
the reports work on it. No module hook is attached between recorded steps.

Output directory::

    OUT/
      watch.json       options, the layers (parameter names) in order, versions; complete
      scalars.jsonl    per step: step, loss, grad_norm, nonfinite, lr, recorded
      layers.jsonl     per step: per-layer gradient norms and update/param ratios
      alerts.jsonl     one Alert per line (also logged as watch_alert)
      recording/       a precguard recording of the recorded steps (records' step = training step)

One watch writes a directory at a time: the directory's writer lock (the
recording's, :mod:`precguard.dump.lock`) is taken before anything in it is looked
at or removed, so a second ``watch(out=D, overwrite=True)`` is refused with D
untouched. An I/O error on the watch's files (disk full, a file-size limit, the
directory made read-only) is logged once as ``watch_stopped_writing``; the watch
stops writing, keeps detecting and logging alerts, and training goes on;
``watch.json`` then says ``complete: false`` with the error and ``steps_written``.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from precguard import __version__, plugins
from precguard._logging import get_logger
from precguard.capture.api import environment_fingerprint
from precguard.capture.compiled import compiled_modules, drop_compiled_code, refusal
from precguard.capture.handle import Handle
from precguard.capture.monitor import Monitor, module_names
from precguard.capture.options import CaptureOptions
from precguard.capture.recording import Recording
from precguard.capture.stats import capture_scope
from precguard.dump.lock import hold_writer_lock, release_writer_lock
from precguard.dump.writer import write_json_or_in_place
from precguard.errors import OutputExistsError, UsageError
from precguard.text import shown
from precguard.training.alerts import Alert, WatchOptions
from precguard.training.detect import Detectors
from precguard.training.pulse import Pulse, StepScalars

logger = get_logger(__name__)

SCHEMA_VERSION = 1
WATCH_FILE = "watch.json"
SCALARS_FILE = "scalars.jsonl"
LAYERS_FILE = "layers.jsonl"
ALERTS_FILE = "alerts.jsonl"
RECORDING_DIR = "recording"


def _json_number(v: float | None) -> float | str | None:
    """A float as strict JSON: NaN and infinities as the strings the recording format uses."""
    if v is None or math.isfinite(v):
        return v
    return "NaN" if math.isnan(v) else ("Infinity" if v > 0 else "-Infinity")


def _prepare(out: Path, overwrite: bool) -> None:
    """Make ``out`` this watch's directory and take its writer lock, or refuse unchanged.

    Every refusal comes before anything is removed: the checks, then the lock (held
    by a watch still writing there: refused), and only then the old files go.
    """
    if out.exists() and not out.is_dir():
        raise UsageError(f"{shown(out)}: exists and is not a directory")
    replacing = out.is_dir() and any(out.iterdir())
    if replacing:
        if not overwrite:
            raise OutputExistsError(
                f"{shown(out)}: directory exists and is not empty (pass overwrite=True to "
                "replace a watch directory)"
            )
        if not (out / WATCH_FILE).is_file():
            raise OutputExistsError(
                f"{shown(out)}: refusing to overwrite a directory that is not a precguard "
                f"watch (no {WATCH_FILE})"
            )
    out.mkdir(parents=True, exist_ok=True)
    hold_writer_lock(out, what="watch")
    if replacing:
        try:
            for name in (WATCH_FILE, SCALARS_FILE, LAYERS_FILE, ALERTS_FILE):
                (out / name).unlink(missing_ok=True)
        except BaseException:
            release_writer_lock(out)
            raise


class _RecordedStep:
    """A step being recorded in full: its hooks and the parameters before its update."""

    def __init__(self, step: int, monitor: Monitor, before: list[torch.Tensor]) -> None:
        self.step = step
        self.monitor = monitor
        self.before = before
        self.retraced = False  # its compiled code was dropped for the hooks


class WatchHandle(Handle):
    """What :func:`watch` returns, a :class:`~precguard.capture.handle.Handle`: call
    :meth:`step` once per optimizer step, :meth:`remove` (or leave the ``with``) at the end.

    >>> with precguard.watch(model, optimizer, out="runs/watch") as w:   # doctest: +SKIP
    ...     for batch in batches:
    ...         loss = model(**batch).loss
    ...         loss.backward(); optimizer.step(); optimizer.zero_grad()
    ...         w.step(loss)
    """

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer | None,
        out: str | os.PathLike[str] | None,
        options: WatchOptions,
        *,
        overwrite: bool = False,
    ) -> None:
        super().__init__()
        self.model = model
        self.optimizer = optimizer
        self.options = options
        self.path = Path(out) if out is not None else None
        #: every alert so far
        self.alerts: list[Alert] = []
        self.step_index = 0
        self.closed = False
        self._alert_records_left = options.max_alert_records
        self._files: dict[str, Any] = {}
        self._recording: Recording | None = None
        self._current: _RecordedStep | None = None
        #: whether the last step() was handed the loop's gradient norm
        self._norm_given = False
        #: the I/O error that stopped the watch writing its files, or None while it writes
        self.write_failure: OSError | None = None
        #: steps whose lines were all written before ``write_failure``
        self.steps_written: int | None = None
        self._locked = False
        self.pulse = Pulse(model)
        self.detectors = Detectors(self.pulse.names, options)
        if self.path is None:
            return
        try:
            _prepare(self.path, overwrite)
            self._locked = True
            first = next(model.parameters(), None)
            device = first.device.type if first is not None else "cpu"
            dtype = (
                str(first.dtype).removeprefix("torch.")
                if first is not None and first.is_floating_point()
                else None
            )
            self._recording = Recording(
                self.path / RECORDING_DIR,
                CaptureOptions(params="every_step", hashes=options.hashes),
                overwrite=overwrite,
                device=device,
                dtype=dtype,
                model=type(model).__name__,
                fingerprint=environment_fingerprint(device),
                auto_step=False,
                to_host=plugins.to_host,
            )
            self._files = {
                name: open(self.path / name, "a", encoding="utf-8")  # noqa: SIM115
                for name in (SCALARS_FILE, LAYERS_FILE, ALERTS_FILE)
            }
            self._write_watch_file(complete=False)
        except BaseException:
            self.pulse.remove()
            self._close_files()
            if self._locked:
                release_writer_lock(self.path)
                self._locked = False
            raise
        self._begin_recorded_step(0, tensors=False)  # step 0 is every N-th

    # -- the public surface ------------------------------------------------------------

    @property
    def recording_path(self) -> Path | None:
        """``OUT/recording``: the recorded steps as a precguard recording (None without out)."""
        return self.path / RECORDING_DIR if self.path is not None else None

    def step(
        self,
        loss: torch.Tensor | float | None = None,
        *,
        grad_norm: torch.Tensor | float | None = None,
    ) -> list[Alert]:
        """End the current training step; return the alerts it raised.

        Call it after ``optimizer.step()``. ``loss``: the step's loss (a
        tensor stays on the device; default: the ``loss`` of the model's last
        output, as HF models return it). ``grad_norm``: the global gradient
        norm the loop already computed, what ``torch.nn.utils.clip_grad_norm_``
        returns (the norm before clipping). Given it, the watch takes no
        gradient norm of its own from the next step on (its one pass over the
        gradients), except on recorded steps; per-layer gradient norms are
        then recorded steps' only, and a non-finite norm names the layers
        whose parameters went non-finite. Without it, the watch's hooks take
        every parameter's norm as backward produces it.
        """
        if self.closed:
            raise UsageError("watch.step() after the watch was closed")
        step = self.step_index
        scalars = self.pulse.collect(step, loss, grad_norm)
        if scalars.nonfinite and not scalars.names_a_layer and not self.detectors.in_nonfinite:
            # the first non-finite step, and no per-layer number says where: look once
            scalars = replace(scalars, nonfinite_params=self.pulse.nonfinite_params())
        self._norm_given = grad_norm is not None
        recorded = self._current is not None
        if self._current is not None:
            self._end_recorded_step()
        alerts = self.detectors.observe(scalars)
        following = step + 1
        record_next = (
            bool(alerts) and self.options.on_alert == "record" and self._alert_records_left > 0
        )
        if record_next and self._recording is not None:
            self._alert_records_left -= 1
            alerts = [a.model_copy(update={"recorded_step": following}) for a in alerts]
        for alert in alerts:
            logger.warning(
                "watch_alert",
                kind=alert.kind,
                step=alert.step,
                layers=[e.layer for e in alert.layers][:10],
                message=alert.message,
            )
        self.alerts.extend(alerts)
        self._write_step(scalars, alerts, recorded)
        self.step_index = following
        if self._recording is not None and (record_next or following % self.options.every == 0):
            self._begin_recorded_step(following, tensors=record_next)
        # the watch's own pass over the gradients: when the loop computes no norm, or
        # on a recorded step (whose layers' gradient norms are part of its record)
        self.pulse.layer_grads = not self._norm_given or self._current is not None
        return alerts

    def remove(self, error: BaseException | None = None) -> None:
        """Remove every hook, finish the files. Idempotent (:meth:`close` is its old name).

        A step being recorded when the watch closes keeps what it recorded.
        ``error``: the exception that ended training, if any (the recording
        then says ``complete: false``).
        """
        if self.closed:
            return
        self.closed = True
        try:
            self.pulse.remove()
            if self._current is not None:
                self._current.monitor.remove()
                self._current = None
            if self._recording is not None:
                self._recording.close(error)
            self._close_files()
            if self.path is not None:
                self._write_watch_file(complete=error is None, last=True)
        finally:
            self._close_files()
            if self._locked and self.path is not None:
                release_writer_lock(self.path)
                self._locked = False

    #: the watch's first name for :meth:`remove`, kept: ``handle.close()`` still closes it
    close = remove

    # -- recorded steps ----------------------------------------------------------------

    def _begin_recorded_step(self, step: int, *, tensors: bool) -> None:
        rec = self._recording
        assert rec is not None
        if rec.steps_seen:
            rec.step()  # flushes the previous recorded step and clears its call counts
        rec.step_index = step
        options = CaptureOptions(params="every_step", tensors=tensors, hashes=self.options.hashes)
        with torch.no_grad(), capture_scope():
            before = [p.detach().clone() for _n, p in self.pulse.params]
        # a model torch.compile already ran would rerun its hook-less code and record the
        # root alone: its code is dropped so this step is retraced with the hooks (issue 37)
        retraced = bool(drop_compiled_code(self.model))
        self._current = _RecordedStep(step, Monitor(self.model, rec, options), before)
        self._current.retraced = retraced

    def _end_recorded_step(self) -> None:
        current, rec = self._current, self._recording
        assert current is not None and rec is not None
        self._current = None
        current.monitor.remove()
        if current.retraced:  # recompiled without the hooks' graph breaks
            drop_compiled_code(self.model)
        try:
            self._record_optimizer(rec, current)
        except Exception as exc:  # the run goes on without them
            logger.error("watch_optimizer_record_failed", error=f"{type(exc).__name__}: {exc}")
        rec.flush()

    def _record_optimizer(self, rec: Recording, current: _RecordedStep) -> None:
        """Record each parameter's update and optimizer state as ``backward.param`` records.

        Under its module, named ``optimizer.update.<param>`` (the change the step
        made) and ``optimizer.<state>.<param>`` (Adam's ``exp_avg``,
        ``exp_avg_sq``, SGD's ``momentum_buffer``: every state tensor shaped
        like the parameter).
        """
        names = module_names(self.model)
        by_module: dict[str, tuple[str, list[tuple[str, torch.Tensor]]]] = {}
        owners = {
            f"{n}.{pn}" if n != "root" else pn: (n, type(m).__name__)
            for m, n in names.items()
            for pn, _p in m.named_parameters(recurse=False)
        }
        state = self.optimizer.state if self.optimizer is not None else {}
        with torch.no_grad(), capture_scope():
            for (qual, p), before in zip(self.pulse.params, current.before, strict=True):
                module, mtype = owners.get(qual, ("root", type(self.model).__name__))
                short = qual.rpartition(".")[2]
                items = by_module.setdefault(module, (mtype, []))[1]
                items.append((f"optimizer.update.{short}", p.detach() - before))
                for key, value in state.get(p, {}).items():
                    if isinstance(value, torch.Tensor) and value.shape == p.shape:
                        items.append((f"optimizer.{key}.{short}", value))
        for module, (mtype, items) in by_module.items():
            rec.add(module, mtype, 0, "backward", "param", items)

    # -- files -------------------------------------------------------------------------

    def _write_step(self, s: StepScalars, alerts: list[Alert], recorded: bool) -> None:
        if not self._files:
            return
        lr = (
            [_json_number(float(g["lr"])) for g in self.optimizer.param_groups if "lr" in g]
            if self.optimizer is not None
            else None
        )
        scalars = {
            "step": s.step,
            "loss": _json_number(s.loss),
            "grad_norm": _json_number(s.grad_norm),
            "nonfinite": s.nonfinite,
            "lr": lr,
            "recorded": recorded,
        }
        layers = {
            "step": s.step,
            "grad_norm": [_json_number(v) for v in s.grad_norms],
            "update_ratio": [_json_number(v) for v in s.update_ratios],
        }
        try:
            self._files[SCALARS_FILE].write(json.dumps(scalars) + "\n")
            self._files[LAYERS_FILE].write(json.dumps(layers) + "\n")
            for alert in alerts:
                self._files[ALERTS_FILE].write(alert.model_dump_json() + "\n")
            for f in self._files.values():
                f.flush()
        except OSError as exc:
            self._stop_writing(exc)

    def _stop_writing(self, exc: OSError) -> None:
        """After the I/O error ``exc``: log it once, write nothing more; training goes on."""
        if self.write_failure is not None:
            return
        self.write_failure = exc
        self.steps_written = self.step_index  # this step's lines may be cut: not counted
        self._close_files()
        logger.error(
            "watch_stopped_writing",
            path=str(self.path),
            step=self.step_index,
            error=f"{type(exc).__name__}: {exc}",
            reason="an I/O error while writing the watch's files; training goes on, alerts "
            "are still logged",
        )

    def _write_watch_file(self, *, complete: bool, last: bool = False) -> None:
        """Write ``watch.json``; at the close (``last``), an I/O error is logged, not raised."""
        assert self.path is not None
        info = {
            "schema_version": SCHEMA_VERSION,
            "precguard_version": __version__,
            "torch_version": torch.__version__,
            "model": type(self.model).__name__,
            "options": self.options.model_dump(mode="json"),
            "layers": self.pulse.names,
            "steps": self.step_index,
            "alerts": len(self.alerts),
            "complete": complete and self.write_failure is None,
        }
        if self.write_failure is not None:
            exc = self.write_failure
            info["steps_written"] = self.steps_written
            info["error"] = {"type": type(exc).__name__, "message": str(exc)}
        if not last:
            write_json_or_in_place(self.path / WATCH_FILE, json.dumps(info, indent=2))
            return
        try:
            write_json_or_in_place(self.path / WATCH_FILE, json.dumps(info, indent=2))
        except OSError as exc:
            if self.write_failure is None:
                self._stop_writing(exc)

    def _close_files(self) -> None:
        """Close the JSONL files; an error flushing them stops the watch's writing."""
        files, self._files = self._files, {}
        failed: OSError | None = None
        for f in files.values():
            try:
                f.close()
            except OSError as exc:
                failed = failed or exc
        if failed is not None:
            self._stop_writing(failed)


def watch(
    model: nn.Module,
    optimizer: torch.optim.Optimizer | None = None,
    *,
    every: int = 1000,
    out: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    **options: Any,
) -> WatchHandle:
    """Watch a training run: per-step scalars, alerts that name the layer, sampled recordings.

    :param model: the model being trained (its parameters are the layers alerts name).
    :param optimizer: its optimizer; recorded steps then hold its state (Adam's
        moments) next to each parameter's update, and ``scalars.jsonl`` the learning rates.
    :param every: record every N-th step in full statistics (default 1000, as W&B's watch).
    :param out: output directory (refused if non-empty unless ``overwrite``); None only
        logs alerts.
    :param options: further fields of :class:`WatchOptions`: ``window``, ``min_history``,
        ``z_threshold``, ``on_alert`` ("log" or "record"), ``max_alert_records``, ``hashes``.
    :returns: a :class:`WatchHandle`; call ``step()`` after each optimizer step
        (``step(loss, grad_norm=clip_grad_norm_(...))`` where the loop clips: the watch
        then makes no pass of its own over the gradients), and use it as a context
        manager (or call ``remove()``) so its hooks go at the end.

    >>> w = precguard.watch(model, opt, every=500, out="w", on_alert="record")  # doctest: +SKIP
    """
    compiled = compiled_modules(model)
    if compiled:
        raise UsageError(refusal(compiled, entry="watch"))
    opts = WatchOptions(every=every, **options)
    return WatchHandle(model, optimizer, out, opts, overwrite=overwrite)
