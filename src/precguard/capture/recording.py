"""The sink every capture writes into: step bookkeeping, statistics, NaN/Inf origin, flushing.

A :class:`Recording` knows nothing about hooks. ``monitor`` and
``precision_monitor`` call :meth:`Recording.enter` and
:meth:`Recording.leave` around each call (and :meth:`Recording.add` for
parameters and gradients) from their hooks; the recording numbers calls and
steps, queues statistics without host syncs, and writes one batch of
records per flush (the end of each root forward, and each step boundary).
Without an output directory it only watches for NaN/Inf and logs.
"""

from __future__ import annotations

import json
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from precguard._logging import get_logger
from precguard.backend import GEMM_PRECISION
from precguard.capture.hashing import HashBuffer
from precguard.capture.hooks import NonFiniteOrigin
from precguard.capture.options import CaptureOptions, OnNonFinite
from precguard.capture.run_dir import agree_on_run_dir
from precguard.capture.stats import _DTYPE_INFO, StatsBuffer, capture_scope, dtype_info
from precguard.dump.lock import release_writer_lock
from precguard.dump.paths import rank_dir
from precguard.dump.writer import RunWriter, write_json_atomic
from precguard.errors import NonFiniteError

logger = get_logger(__name__)


def dist_rank_world() -> tuple[int, int]:
    """Return ``(rank, world_size)`` of the default process group, or ``(0, 1)``."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def plain_host_copy(t: torch.Tensor) -> torch.Tensor:
    """A plain, contiguous CPU copy of ``t``: what a recording saves unless told otherwise.

    Devices whose tensors the CPU cannot read directly (Ascend's internal NZ
    layout) need their backend's :meth:`~precguard.backend.Backend.to_host`:
    the public API hands the recording :func:`precguard.plugins.to_host`.
    """
    return t.detach().to("cpu", copy=True).contiguous()


#: torch's one check of every device type's autocast flag (no device object built),
#: asked first: ``t.device.type`` alone costs a microsecond per record
_ANY_AUTOCAST: Callable[[], bool] = getattr(torch._C, "_is_any_autocast_enabled", lambda: True)


def _autocast_dtype(t: torch.Tensor) -> str | None:
    """The autocast dtype in force for ``t``'s device type, or None when autocast is off.

    Under autocast a module computes its matmuls in this dtype whatever its inputs'
    dtype, so compare must judge its records by this precision, not the stored one.
    """
    if not _ANY_AUTOCAST():
        return None
    kind = t.device.type
    try:
        if not torch.is_autocast_enabled(kind):
            return None
        return str(torch.get_autocast_dtype(kind)).removeprefix("torch.")
    except RuntimeError:  # a device type autocast does not know
        return None


#: module types whose GEMM an fp8 profile runs in fp8, and the records of theirs it computes
_GEMM_MODULES = frozenset({"Linear", "NonDynamicallyQuantizableLinear"})
_GEMM_RECORDS = frozenset({("forward", "output"), ("backward", "input"), ("backward", "grad")})


def _gemm_dtype(module_type: str, phase: str, role: str) -> str | None:
    """The fp8 dtype a Linear's GEMM computed this record in (an fp8 ``emu:`` profile), or
    None: compare then judges it by the fp8 GEMM's expected error, not the run's dtype."""
    if module_type in _GEMM_MODULES and (phase, role) in _GEMM_RECORDS:
        return GEMM_PRECISION.dtype
    return None


class CallFrame:
    """One module (or decorated function) call between its inputs and its outputs."""

    __slots__ = (
        "call",
        "inputs",
        "inputs_finite",
        "module",
        "module_type",
        "on_nonfinite",
        "recomputed",
        "save",
    )

    def __init__(
        self,
        module: str,
        module_type: str,
        call: int,
        save: bool,
        on_nonfinite: OnNonFinite,
        recomputed: bool = False,
    ) -> None:
        self.module = module
        self.module_type = module_type
        self.call = call
        self.save = save
        self.on_nonfinite = on_nonfinite
        #: a forward run again during backward (activation checkpointing): nothing
        #: recorded in forward; its gradients are keyed at the call it recomputes
        self.recomputed = recomputed
        self.inputs_finite: bool | None = True
        self.inputs: list[tuple[str, torch.Tensor]] = []


def _save_inputs(folder: Path, tensors: dict[str, torch.Tensor]) -> bool:
    """Write a NaN/Inf origin's inputs under ``folder``; True once written."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(folder / "inputs.safetensors"))
    return True


class Recording:
    """One rank's recording in progress (or a watch-only sink when ``out`` is None)."""

    #: full tensors held in host memory before they are written out as one
    #: safetensors file, so saving every tensor of a large model never holds a
    #: whole step's activations at once
    TENSOR_CHUNK_BYTES = 256 * 2**20

    def __init__(
        self,
        out: str | os.PathLike[str] | None,
        options: CaptureOptions | None = None,
        *,
        overwrite: bool = False,
        device: str | None = None,
        dtype: str | None = None,
        model: str | None = None,
        target: str | None = None,
        fingerprint: dict[str, Any] | None = None,
        auto_step: bool = True,
        compute_dtype: str | None = None,
        to_host: Callable[[torch.Tensor], torch.Tensor] = plain_host_copy,
        fingerprint_of: Callable[[str], dict[str, Any]] | None = None,
    ) -> None:
        self.options = options or CaptureOptions()
        #: copies a tensor to host memory before it is saved (the device's backend's job)
        self.to_host = to_host
        #: the environment fingerprint of a device, for facts learnt after opening
        self.fingerprint_of = fingerprint_of
        self.rank, world_size = dist_rank_world()
        self.path: Path | None = None
        self.writer: RunWriter | None = None
        if out is not None:
            # Every rank writes its own rank{R}/ below the same run directory;
            # rank 0 decides whether it can be used and every rank follows.
            self.path = agree_on_run_dir(
                out, overwrite=overwrite, rank=self.rank, world_size=world_size
            )
            try:
                self.writer = RunWriter(
                    self.path,
                    rank=self.rank,
                    world_size=world_size,
                    device=device or "cpu",
                    dtype=dtype,
                    model=model,
                    target=target,
                    options=self.options.model_dump(mode="json"),
                    fingerprint=fingerprint,
                )
                if compute_dtype is not None:
                    self.writer.update_manifest(compute_dtype=compute_dtype)
            except BaseException:
                release_writer_lock(self.path)  # the directory is free for the next try
                raise
        # manifest facts not known when the recording opened (recording(): the
        # device, dtype and model come with the first decorated module called)
        self.missing_facts: set[str] = set()
        if self.writer is not None:
            given = {"device": device, "dtype": dtype, "model": model, "fingerprint": fingerprint}
            self.missing_facts = {k for k, v in given.items() if v is None}
        self.step_index = 0
        self.closed = False
        self.covered: set[int] = set()  # ids of modules hooked by monitor() into this sink
        self._seq = 0
        self._stats = StatsBuffer(evidence=self.options.evidence)
        self._hashes = HashBuffer() if self.options.hashes else None
        self._pending: list[tuple[dict[str, Any], int | None]] = []
        #: a pending record may hold a NaN/Inf (seen, or not known before the flush's
        #: transfer); while False the flush skips the origin scan of its records
        self._maybe_nonfinite = False
        self._tensors: dict[str, torch.Tensor] = {}  # saved tensors not yet on disk
        self._tensor_bytes = 0
        self._tensor_files: dict[str, str] = {}  # key -> file, for records not yet written
        self._calls: dict[int, int] = {}
        self._recomputes: dict[int, int] = {}  # per module this step: calls recomputed
        #: module calls recomputed during backward (activation checkpointing), whole run
        self.recomputed_calls = 0
        self._step_owner: int | None = None
        self._explicit_steps = not auto_step
        #: this step's NaN/Inf origin per phase, from the records in capture order
        self._origin = NonFiniteOrigin()
        self._nonfinite_acted = False
        self.steps_seen = 0
        #: the I/O error that stopped the recording (disk full, directory made
        #: read-only, device error), or None while it records
        self.write_failure: OSError | None = None
        #: steps whose records were all written before ``write_failure``
        self.steps_written: int | None = None
        self._failed_writer: RunWriter | None = None

    def fill_facts(self, *, device: str | None, dtype: str | None, model: str | None) -> None:
        """Fill the manifest facts the recording was opened without, once.

        ``recording()`` opens before any model runs; the first decorated module or
        function called in it tells the device, the model dtype and the model's
        class, and the environment fingerprint follows from the device.
        """
        if not self.missing_facts or self.writer is None:
            return
        missing, self.missing_facts = self.missing_facts, set()
        facts: dict[str, Any] = {}
        if "device" in missing and device is not None:
            facts["device"] = device
        if "dtype" in missing and dtype is not None:
            facts["dtype"] = dtype
        if "model" in missing and model is not None:
            facts["model"] = model
        if "fingerprint" in missing and self.fingerprint_of is not None:
            facts["fingerprint"] = self.fingerprint_of(
                facts.get("device", self.writer.manifest.device)
            )
        if facts:
            self._guard_io(self.writer.update_manifest, **facts)

    # -- steps and calls ---------------------------------------------------------------

    def begin_call(self, obj: object, *, root: bool) -> int:
        """Count one call of ``obj`` in this step and return its 0-based call index.

        A root call opens a step; the same root called again starts the next
        step unless steps are explicit (:meth:`step` was called).
        """
        key = id(obj)
        if root and not self._explicit_steps:
            if self._step_owner is None:
                self._step_owner = key
            elif self._step_owner == key and self._calls.get(key, 0) > 0:
                self._advance()
                self._step_owner = key
        call = self._calls.get(key, 0)
        self._calls[key] = call + 1
        self.steps_seen = max(self.steps_seen, self.step_index + 1)
        return call

    def recompute(
        self, obj: object, module: str, module_type: str, *, save: bool, on_nonfinite: OnNonFinite
    ) -> CallFrame:
        """A frame for a forward that autograd runs again in backward (checkpointing).

        Nothing is recorded for it in forward: the original call was, with the same
        inputs. It gets the index of the call it recomputes, so that the gradients
        that flow through it (reentrant checkpointing backpropagates through the
        recomputed graph) are keyed as without checkpointing. Segments are
        recomputed in reverse order, so a module's k-th recomputation in a step is
        matched with its k-th call from the end.
        """
        key = id(obj)
        done = self._recomputes.get(key, 0)
        self._recomputes[key] = done + 1
        self.recomputed_calls += 1
        call = max(self._calls.get(key, 1) - 1 - done, 0)
        return CallFrame(module, module_type, call, save, on_nonfinite, recomputed=True)

    def step(self) -> None:
        """End the current step explicitly; from now on steps advance only here."""
        self._explicit_steps = True
        self._advance()

    def _advance(self) -> None:
        self.flush()  # also empties the statistics buffer
        self.step_index += 1
        self._calls.clear()
        self._recomputes.clear()
        self._origin.reset()
        self._nonfinite_acted = False

    def enter(
        self,
        obj: object,
        module: str,
        module_type: str,
        inputs: list[tuple[str, torch.Tensor]],
        *,
        root: bool,
        save: bool,
        on_nonfinite: OnNonFinite,
    ) -> CallFrame:
        """Start a call of ``obj``: count it, record its inputs, return its frame.

        ``on_nonfinite`` is the caller's policy: with ``"save"``/``"raise"``
        finiteness is checked at once (a host sync on accelerators), and with
        ``"save"`` the inputs are kept until :meth:`leave`.
        """
        key = id(obj)
        if root and not self._explicit_steps:  # begin_call's step rule
            call = self.begin_call(obj, root=root)
        else:  # begin_call, inlined: once per module call
            calls = self._calls
            call = calls.get(key, 0)
            calls[key] = call + 1
            if self.steps_seen <= self.step_index:
                self.steps_seen = self.step_index + 1
        frame = CallFrame(module, module_type, call, save, on_nonfinite)
        frame.inputs_finite = self.add(
            module,
            module_type,
            frame.call,
            "forward",
            "input",
            inputs,
            save=save,
            need_finite=on_nonfinite != "record",
        )
        if on_nonfinite == "save":
            frame.inputs = inputs
        return frame

    def leave(
        self,
        frame: CallFrame,
        outputs: list[tuple[str, torch.Tensor]],
        *,
        extra: dict[str, Any] | None = None,
    ) -> None:
        """Record the outputs of ``frame``'s call; act on a NaN/Inf born in it.

        Raises :class:`NonFiniteError` when the frame's policy is ``"raise"``
        and this call is the step's first origin. ``extra``: further fields for
        each output record (see :meth:`add`).
        """
        immediate = frame.on_nonfinite != "record"
        finite = self.add(
            frame.module,
            frame.module_type,
            frame.call,
            "forward",
            "output",
            outputs,
            save=frame.save,
            need_finite=immediate,
            extra=extra,
        )
        if immediate and finite is False and frame.inputs_finite is not False:
            self._on_nonfinite_origin(frame)

    # -- capture -----------------------------------------------------------------------

    def add(
        self,
        module: str,
        module_type: str,
        call: int,
        phase: str,
        role: str,
        items: list[tuple[str, torch.Tensor]],
        *,
        save: bool = False,
        need_finite: bool = False,
        first_index: int = 0,
        extra: dict[str, Any] | None = None,
    ) -> bool | None:
        """Queue one record per tensor in ``items``; return whether all were finite.

        The return value is None when finiteness is unknown without a host
        sync (accelerators, unless ``need_finite``). ``extra``: further fields
        for each record (a collective's ``collective`` description).
        """
        all_finite: bool | None = True
        if not items:
            return all_finite
        # autocast off (the flag, a C call): no Python frame asks the device type
        autocast = _autocast_dtype(items[0][1]) if _ANY_AUTOCAST() else None
        if GEMM_PRECISION.dtype is not None:
            autocast = _gemm_dtype(module_type, phase, role) or autocast
        prefix = f"{module}.{call}.{phase}.{role}."
        positions = role in ("input", "output")
        add_new = self._stats.add_new
        reuse = self._stats.reuse
        step, rank = self.step_index, self.rank
        keep = save and self.writer is not None
        infos = _DTYPE_INFO
        hashes = self._hashes
        for index, (name, t) in enumerate(items, first_index):
            key = prefix + str(index)
            info = infos.get(t.dtype) or dtype_info(t.dtype)
            numel = t.numel()
            slot: int | None = None
            if info.has_stats and numel:
                # StatsBuffer.add's reuse of a tensor seen unchanged (a module's input that
                # is the previous module's output), inlined: no call for a hit
                reused = (id(t), t._version)
                hit = reuse.get(reused)
                if hit is not None and hit[0]() is t:
                    reuse.move_to_end(reused)
                    slot, finite = hit[1], hit[2]
                    if finite is None and need_finite:
                        finite = self._stats.finite(slot)
                else:
                    slot, finite = add_new(t, reused, need_finite, positions)
                if finite is None:
                    all_finite = None
                elif not finite and all_finite is not None:
                    all_finite = False
            rec: dict[str, Any] = {
                "key": key,
                "module": module,
                "module_type": module_type,
                "call": call,
                "phase": phase,
                "role": role,
                "index": index,
                "name": name,
                "step": step,
                "rank": rank,
                "seq": self._seq,
                "dtype": info.name,
                "shape": list(t.shape),
            }
            if autocast is not None and info.is_floating_point:
                rec["compute_dtype"] = autocast
            if extra:
                rec.update(extra)
            if hashes is not None and numel:
                with capture_scope():
                    rec["hash"] = hashes.add(t)  # the slot, until flush
            self._seq += 1
            if keep:
                with capture_scope():
                    host = self.to_host(t)
                self._tensors[key] = host
                self._tensor_bytes += host.numel() * host.element_size()
            self._pending.append((rec, slot))
        if all_finite is not True:
            self._maybe_nonfinite = True
        if self._tensor_bytes > self.TENSOR_CHUNK_BYTES:
            self._save_tensors()
        return all_finite

    def _save_tensors(self) -> None:
        """Write the full tensors held so far to one safetensors file and forget them."""
        if not self._tensors or self.writer is None:
            return
        file = self._guard_io(self.writer.save_tensors, self._tensors, self.step_index)
        if file is None:
            return
        for key in self._tensors:
            self._tensor_files[key] = file
        self._tensors = {}
        self._tensor_bytes = 0

    # -- non-finite origin -------------------------------------------------------------

    def _on_nonfinite_origin(self, frame: CallFrame) -> None:
        """Act on an origin found in a hook (``save`` / ``raise``), once per step."""
        if self._nonfinite_acted:
            return
        self._nonfinite_acted = True
        if frame.on_nonfinite == "save":
            self._save_origin_inputs(frame.module, frame.module_type, frame.call, frame.inputs)
            return
        raise NonFiniteError(
            f"non-finite output first produced by {frame.module} ({frame.module_type}), call "
            f"{frame.call}, step {self.step_index}, rank {self.rank}: its inputs were finite",
            module=frame.module,
            step=self.step_index,
            key=f"{frame.module}.{frame.call}.forward.output",
        )

    def _save_origin_inputs(
        self, module: str, module_type: str, call: int, inputs: list[tuple[str, torch.Tensor]]
    ) -> None:
        if self.write_failure is not None:
            return  # the recording stopped at an I/O error; the run goes on unrecorded
        if self.path is None:
            # Watch-only mode has no directory of its own; writing into the
            # current directory would surprise (and could clobber) the user.
            logger.warning(
                "nonfinite_inputs_not_saved",
                module=module,
                reason="watch-only mode (no out=): pass out= to save the origin's inputs",
            )
            return
        base = rank_dir(self.path, self.rank)
        folder = base / f"nonfinite-step{self.step_index:06d}-{module.replace('/', '_')}"
        with capture_scope():
            tensors = {name: self.to_host(t) for name, t in inputs}
        if self._guard_io(_save_inputs, folder, tensors) is None:
            return
        note = {
            "module": module,
            "module_type": module_type,
            "call": call,
            "step": self.step_index,
            "rank": self.rank,
            "inputs": {n: {"dtype": str(t.dtype), "shape": list(t.shape)} for n, t in inputs},
            "stack": traceback.format_stack()[:-3],
        }
        self._guard_io(write_json_atomic, folder / "note.json", json.dumps(note, indent=2))
        if self.write_failure is not None:
            return
        logger.warning("nonfinite_inputs_saved", module=module, path=str(folder))

    def _scan_nonfinite(self, records: list[dict[str, Any]]) -> None:
        """Mark the NaN/Inf origin among ``records`` (in capture order) and log it."""
        origin = self._origin
        for rec in records:
            stats = rec.get("stats")
            finite = stats is None or not (stats["nan"] or stats["inf"])
            phase = rec["phase"]
            if phase == "forward":
                group = (rec["module"], rec["call"])
                if rec["role"] == "input":
                    origin.inputs(group, finite)
                    continue
                if rec["role"] != "output" or not origin.output(group, finite):
                    continue
            elif not origin.first(rec["key"], finite, phase):
                continue
            rec["nonfinite_origin"] = True
            logger.warning(
                "nonfinite_origin",
                module=rec["module"],
                module_type=rec["module_type"],
                key=rec["key"],
                phase=phase,
                step=rec["step"],
                rank=rec["rank"],
                nan=stats["nan"],
                inf=stats["inf"],
            )

    # -- output ------------------------------------------------------------------------

    def flush(self) -> None:
        """Materialize queued statistics (one host transfer) and write the records.

        Never raises into the host program (it runs from ``step()`` and the hooks): a
        failure loses this flush's records, is logged as ``flush_failed``, and the
        recording goes on with the next ones.
        """
        try:
            self._flush()
        except Exception as exc:  # the user's loop must not pay for it
            self._pending = []
            self._maybe_nonfinite = False
            self._stats.clear()
            if self._hashes is not None:
                self._hashes.clear()
            logger.error(
                "flush_failed",
                path=str(self.path),
                rank=self.rank,
                step=self.step_index,
                error=f"{type(exc).__name__}: {exc}",
            )

    def _flush(self) -> None:
        if not self._pending:
            return
        stats, evidence = self._stats.materialize_with_evidence()
        records = []
        for rec, slot in self._pending:
            if slot is None:
                rec["stats"] = None
            else:
                rec["stats"] = stats[slot]
                fields = evidence[slot]
                if fields is not None:
                    rec.update(fields)
            records.append(rec)
        self._pending = []
        if self._hashes is not None:
            hashes = self._hashes.materialize()
            for rec in records:
                if "hash" in rec:
                    rec["hash"] = hashes[rec["hash"]]
        if self._maybe_nonfinite:  # every record known finite: no origin among them
            self._maybe_nonfinite = False
            self._scan_nonfinite(records)
        if self.writer is None:
            return
        self._save_tensors()  # before the records that point at them
        if self.writer is None:  # writing them failed: the recording has stopped
            return
        files = self._tensor_files
        for rec in records if files else ():  # most flushes saved no tensor
            file = files.pop(rec["key"], None)
            if file is not None:
                rec["tensor"] = {"file": file, "name": rec["key"]}
        self._guard_io(self.writer.write_records, records, trusted=True)

    # -- I/O failures ------------------------------------------------------------------

    def _guard_io(self, write: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run one write of the recording; on an I/O error stop recording, never raise.

        Returns what ``write`` returned, or None when it failed. The host
        program's forward, backward and the code after the ``with`` block must
        not be the ones to pay for a full disk or a directory made read-only:
        the error is logged once, what was written stays readable, and the
        manifest says ``complete: false`` with the error when the run closes.
        """
        try:
            return write(*args, **kwargs)
        except OSError as exc:
            self._stop_recording(exc)
            return None

    def _stop_recording(self, exc: OSError) -> None:
        """Turn the recording into a watch-only sink after the I/O error ``exc``."""
        if self.write_failure is not None:
            return
        self.write_failure = exc
        self.steps_written = self.step_index  # the steps before this one were flushed whole
        self._failed_writer, self.writer = self.writer, None
        self._tensors, self._tensor_files, self._tensor_bytes = {}, {}, 0
        logger.error(
            "recording_stopped",
            path=str(self.path),
            rank=self.rank,
            step=self.step_index,
            error=f"{type(exc).__name__}: {exc}",
            reason="an I/O error while writing the recording; the run goes on unrecorded",
        )

    def close(self, error: BaseException | None = None) -> None:
        """Flush what is left and close the files. Idempotent.

        ``error`` is the exception that ended the run's body, if it raised: the
        manifest then says ``complete: false`` and names the exception.
        """
        if self.closed:
            return
        try:
            self.flush()
        finally:
            self.closed = True
            self._close_writer(error)

    def _close_writer(self, error: BaseException | None) -> None:
        """Close the writer, saying how the run ended; an I/O error here is logged only."""
        writer = self.writer or self._failed_writer
        if writer is None:
            return
        if self.recomputed_calls:  # written with the rest when the writer marks it closed
            writer.manifest = writer.manifest.model_copy(
                update={"recomputed_calls": self.recomputed_calls}
            )
        if self.write_failure is None:
            steps = self.steps_seen
        else:
            error = error or self.write_failure
            steps = self.steps_written
        try:
            writer.close(steps=steps, steps_run=self.steps_seen, error=error)
        except OSError as exc:
            if self.write_failure is None:
                self.write_failure = exc
            logger.error(
                "recording_not_closed",
                path=str(self.path),
                rank=self.rank,
                error=f"{type(exc).__name__}: {exc}",
                reason="the manifest could not be marked complete; it still says complete: false",
            )
