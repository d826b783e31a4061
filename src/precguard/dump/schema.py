"""The recording format: pydantic models for ``manifest.json`` and each JSONL record.

A run is a directory::

    RUN/
      manifest.json                  Manifest
      rank{R}/records.jsonl          one Record per line, appended, flushed per step
      rank{R}/tensors-*.safetensors  full tensors, only when asked for

Non-finite floats are written as the JSON strings ``"NaN"``, ``"Infinity"``
and ``"-Infinity"`` so every file is strict JSON.
"""

from __future__ import annotations

import base64
import math
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

SCHEMA_VERSION = 1

Phase = Literal["forward", "backward"]
Role = Literal["input", "output", "param", "grad", "buffer"]

_FROZEN = ConfigDict(frozen=True, extra="ignore", ser_json_inf_nan="strings")


class Fp8Stats(BaseModel):
    """What a float8 tensor's scale did to it (recorded for float8 dtypes only)."""

    model_config = _FROZEN

    saturated: float = Field(description="Share of elements at the format's ±max (saturated).")
    underflow: float = Field(
        description="Share of elements that are zero (what an underflow flushes to)."
    )
    scale: float | None = Field(
        default=None, description="The tensor's scale when it carries one (None: unscaled)."
    )
    amax: float = Field(description="Largest magnitude the tensor stands for (times its scale).")


class Stats(BaseModel):
    """Summary statistics of one tensor, computed in float32 or wider over all elements.

    ``min``/``max``/``mean``/``std``/``absmax``/``l2`` are NaN when the tensor holds NaN.

    precguard's own capture fills every field. A recording imported from another
    tool (an msprobe dump records only max, min, mean and norm; see docs/msprobe.md)
    leaves what that tool did not measure as None, and compare judges only the
    statistics both sides have.
    """

    model_config = _FROZEN

    min: float = Field(description="Smallest element.")
    max: float = Field(description="Largest element.")
    mean: float | None = Field(default=None, description="Arithmetic mean (None: not recorded).")
    std: float | None = Field(
        default=None,
        description="Standard deviation (unbiased; 0 for one element; None: not recorded).",
    )
    absmax: float = Field(description="Largest absolute value.")
    l2: float | None = Field(
        default=None, description="Euclidean norm of all elements (None: not recorded)."
    )
    nan: int | None = Field(default=None, description="Number of NaN elements (None: unknown).")
    inf: int | None = Field(
        default=None, description="Number of +Inf or -Inf elements (None: unknown)."
    )
    zeros: int | None = Field(
        default=None, description="Number of elements equal to zero (None: unknown)."
    )
    numel: int = Field(description="Number of elements.")
    fp8: Fp8Stats | None = Field(
        default=None, description="A float8 tensor's saturated and underflow shares, scale, amax."
    )

    @property
    def has_nan(self) -> bool:
        """Whether the tensor holds NaN (from the count, else from a NaN extreme).

        Only the extremes tell: max and min propagate NaN, while a NaN mean also
        comes from +Inf and -Inf in one tensor.
        """
        if self.nan is not None:
            return self.nan > 0
        return math.isnan(self.min) or math.isnan(self.max)

    @property
    def has_inf(self) -> bool:
        """Whether the tensor holds +-Inf (from the count, else from its extremes)."""
        if self.inf is not None:
            return self.inf > 0
        return math.isinf(self.min) or math.isinf(self.max)

    @property
    def nonfinite(self) -> int:
        """NaN plus Inf count (1 for each kind known present where a count is unknown)."""
        nan = self.nan if self.nan is not None else int(self.has_nan)
        inf = self.inf if self.inf is not None else int(self.has_inf)
        return nan + inf


STAT_FIELDS: tuple[str, ...] = tuple(Stats.model_fields)


def _decode(values: str, dtype: str) -> np.ndarray:
    """The float64 array of little-endian base64 ``values`` stored as ``dtype``."""
    raw = np.frombuffer(base64.b64decode(values), dtype="<f8" if dtype == "float64" else "<f4")
    return raw.astype(np.float64)


class Sample(BaseModel):
    """Elements of a tensor at indices chosen from its shape (the same on every device).

    The indices are :func:`precguard.capture.evidence.sample_indices` of the
    shape; ``seed`` identifies them, so compare uses two samples only when their
    seeds agree.
    """

    model_config = _FROZEN

    seed: int = Field(description="CRC-32 of the shape without size-1 dims that seeds the set.")
    dtype: Literal["float32", "float64"] = Field(
        default="float32", description="Precision the values are stored in."
    )
    values: str = Field(description="The sampled values, little-endian base64 of dtype.")

    def array(self) -> np.ndarray:
        """The sampled values as a float64 array (in index order)."""
        return _decode(self.values, self.dtype)


class PositionNorms(BaseModel):
    """L2 norms of a sequence-shaped tensor per position (over every other dimension)."""

    model_config = _FROZEN

    dim: int = Field(description="The sequence dimension (1 of 3-d, 2 of 4-d tensors).")
    bin: int = Field(
        description="Consecutive positions per norm (1 up to 256 positions; the last bin "
        "may be shorter)."
    )
    length: int = Field(description="Sequence length (size of dim).")
    dtype: Literal["float32", "float64"] = Field(
        default="float32", description="Precision the norms are stored in."
    )
    norms: str = Field(description="The norms, little-endian base64 of dtype.")

    def array(self) -> np.ndarray:
        """The norms as a float64 array, one per bin of positions."""
        return _decode(self.norms, self.dtype)


class TensorRef(BaseModel):
    """Where a saved full tensor lives, relative to the rank directory."""

    model_config = _FROZEN

    file: str = Field(description="safetensors file name inside rank{R}/.")
    name: str = Field(description="Tensor name inside that file (the record key).")


class Collective(BaseModel):
    """What a ``dist.<op>`` record's collective was: op, API, process group, reduce op."""

    model_config = _FROZEN

    op: str = Field(description="The collective, e.g. 'all_reduce', 'all_gather_into_tensor'.")
    api: str = Field(description="'c10d' (torch.distributed) or 'functional'.")
    group: list[int] | None = Field(
        default=None, description="Global ranks of the process group (None when unknown)."
    )
    reduce_op: str | None = Field(
        default=None, description="The reduction ('sum', 'avg', 'max', ...) if the op reduces."
    )
    async_: bool = Field(
        default=False,
        alias="async",
        description="Called with async_op=True: the output was recorded at wait().",
    )


class Record(BaseModel):
    """One captured tensor."""

    model_config = _FROZEN

    key: str = Field(
        description="Stable id across devices: {module}.{call}.{phase}.{role}.{index}; "
        "the root module is written 'root'."
    )
    module: str = Field(description="Qualified module name ('root' for the root module).")
    module_type: str = Field(description="Class name of the module (or 'function').")
    call: int = Field(description="0-based count of this module's calls within the step.")
    phase: Phase = Field(description="forward or backward.")
    role: Role = Field(
        description="input/output of the module in forward; in backward 'output' is the "
        "gradient w.r.t. an output, 'grad' the gradient of a parameter; 'param' a weight."
    )
    index: int = Field(description="Position among the tensors of this role, in flatten order.")
    name: str = Field(
        default="",
        description="Where the tensor sat: 'args.0', 'kwargs.hidden_states', "
        "'output.logits', or a parameter name.",
    )
    step: int = Field(description="Step number (0-based).")
    rank: int = Field(description="Distributed rank that recorded it.")
    seq: int = Field(description="Order of capture within the rank, over the whole run.")
    dtype: str = Field(description="torch dtype without the 'torch.' prefix (as stored).")
    compute_dtype: str | None = Field(
        default=None,
        description="Precision the value was computed in when it differs from the run's "
        "(the autocast dtype active when it was captured); None: the manifest's "
        "compute_dtype, or the stored dtype. Compare takes the less precise of this and dtype.",
    )
    shape: list[int] = Field(description="Tensor shape.")
    stats: Stats | None = Field(
        default=None, description="Statistics; absent for empty or non-numeric tensors."
    )
    tensor: TensorRef | None = Field(default=None, description="Saved full tensor, if any.")
    sample: Sample | None = Field(
        default=None,
        description="Sampled elements (floating tensors): compare estimates the error from "
        "them when the full tensors are not both saved.",
    )
    positions: PositionNorms | None = Field(
        default=None,
        description="Per-position L2 norms of a sequence-shaped forward tensor.",
    )
    nonfinite_origin: bool = Field(
        default=False,
        description="True on the first non-finite output of the module that introduced "
        "NaN/Inf (its inputs were finite).",
    )
    collective: Collective | None = Field(
        default=None,
        description="On dist.<op> records (a torch.distributed collective): the op and its "
        "process group.",
    )
    device: str | None = Field(
        default=None,
        description="On op-level records: the device type the op's output was on when it "
        "differs from the model's (an op that fell back to the CPU); None: the run's device.",
    )
    hash: str | None = Field(
        default=None,
        # a recording is untrusted input: a hash is 16 hex digits, never free text that
        # would reach the terminal (precguard bitwise prints it)
        pattern=r"^[0-9a-f]{16}$",
        description="Hash of the tensor's bits in logical order (16 hex digits), when "
        "recorded with hashes=True; equal hashes mean bitwise equal values.",
    )


class RunError(BaseModel):
    """The exception that ended a run whose body raised (the recording is incomplete)."""

    model_config = _FROZEN

    type: str = Field(description="Exception class name, e.g. 'RuntimeError'.")
    message: str = Field(default="", description="The exception's message (first 500 chars).")


class Manifest(BaseModel):
    """Run-level metadata, written at start and rewritten when the run closes."""

    model_config = ConfigDict(extra="ignore", ser_json_inf_nan="strings")

    schema_version: int = Field(default=SCHEMA_VERSION, description="Format version.")
    precguard_version: str = Field(description="precguard version that wrote the run.")
    torch_version: str = Field(description="torch version that wrote the run.")
    device: str = Field(description="Device string, e.g. 'cpu', 'cuda:0', 'emu:fp16'.")
    dtype: str | None = Field(default=None, description="Model dtype if known.")
    compute_dtype: str | None = Field(
        default=None,
        description="Precision every float value of the run was computed in when it is lower "
        "than the dtype it is stored in: an emu: profile's compute_dtype (its tensors are "
        "stored as float32), a vendor precision mode. None: values are as precise as their "
        "stored dtype.",
    )
    model: str | None = Field(default=None, description="Class name of the root model.")
    target: str | None = Field(default=None, description="Target spec the run was made from.")
    options: dict[str, Any] = Field(default_factory=dict, description="Capture options.")
    fingerprint: dict[str, Any] = Field(
        default_factory=dict, description="Environment fingerprint (versions, numerics flags)."
    )
    world_size: int = Field(default=1, description="Number of ranks.")
    created: str = Field(description="ISO 8601 time the run started.")
    run_id: str = Field(
        default="",
        description="Random id given when the recording is created; a copy of the "
        "directory keeps it, so compare can tell a recording compared with itself.",
    )
    complete: bool = Field(
        default=False,
        description="True once the run closed cleanly; false while it runs, when it was "
        "killed, and when its body raised (then 'error' says what).",
    )
    error: RunError | None = Field(
        default=None, description="The exception that ended the run, when its body raised."
    )
    steps: int | None = Field(default=None, description="Steps recorded, once complete.")
    recomputed_calls: int = Field(
        default=0,
        description="Module calls run again during backward (activation checkpointing): "
        "recognised, not recorded as further calls (docs/capture.md).",
    )
    steps_run: int | None = Field(
        default=None,
        description="Steps the run went through; more than 'steps' when the recording "
        "stopped early (an I/O error while writing, then 'error' names it).",
    )


class RankStatus(BaseModel):
    """How one rank's part of a recording ended: ``rank{R}/status.json``.

    ``manifest.json`` is rank 0's; every rank writes its own status when it
    opens (``complete: false``) and again when it closes, so a rank killed
    mid-run is told apart from ranks that finished.
    """

    model_config = ConfigDict(extra="ignore")

    rank: int = Field(description="The rank.")
    complete: bool = Field(
        default=False, description="True once this rank closed its recording cleanly."
    )
    steps: int | None = Field(default=None, description="Steps this rank recorded, once closed.")
    steps_run: int | None = Field(
        default=None, description="Steps this rank's run went through, once closed."
    )
    error: RunError | None = Field(
        default=None, description="The exception that ended this rank's run, if it raised."
    )
    host: str = Field(default="", description="Host name the rank ran on.")
    pid: int | None = Field(default=None, description="Process id of the rank.")


def schemas() -> dict[str, Any]:
    """Return the JSON Schemas of the manifest, the record and a rank's status.json."""
    return {
        "manifest": Manifest.model_json_schema(),
        "record": Record.model_json_schema(),
        "status": RankStatus.model_json_schema(),
    }
