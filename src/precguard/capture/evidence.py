"""Evidence a statistics-mode record keeps: a sample of elements and per-position norms.

Statistics alone cannot tell a tensor whose late positions are wrong from a
correct one (the min, max, mean and norm of RoPE's cos/sin barely move when
the angles of positions 100..127 are off by a bf16 rounding). So every
floating tensor also keeps:

* **a sample**: :data:`SAMPLE_SIZE` elements at flat (C-order) indices chosen
  from the tensor's shape alone — a seeded random set plus a few structured
  indices at the last position — so both sides of a compare sample the same
  elements, also when records were aligned by order rather than key or when a
  module's input reuses the previous output's statistics. Compare estimates
  the tensor's relative L2 error from it.
* **per-position norms** of sequence-shaped forward tensors: the L2 norm over
  every dimension but the sequence one, per position (binned into at most
  :data:`POSITION_BINS` runs of consecutive positions). The sequence dimension
  is dimension 1 of a 3-d tensor (``(batch, seq, hidden)``) and dimension 2 of
  a 4-d one (``(batch, heads, seq, head_dim)``), the layouts of HF models'
  hidden states, attention scores and RoPE's cos/sin. Compare reads from them
  where an error is concentrated, and a lower bound on the relative L2 error.

Both are gathered on the tensor's device into the statistics buffer and come
to the host with the step's statistics (no host sync per tensor); on the CPU
both come from the statistics' own read of the tensor (the compiled kernel's,
:func:`precguard.capture.stats._fused_stats`; without it the row norms of
:func:`precguard.capture.stats._host_stats` and ``np.take``). The index set of
a shape is built once and cached.
"""

from __future__ import annotations

import math
import sys
import zlib
from collections import OrderedDict
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
from pybase64 import b64encode_as_string

if TYPE_CHECKING:
    import torch

#: elements sampled from every floating tensor (all of them when it has fewer)
SAMPLE_SIZE = 128
#: of which structured: spread over the last position's channels (heads) and the
#: last row, where an error growing with the position (RoPE) is largest
STRUCTURED = 8
#: version of the index rule (:func:`sample_indices`): bump it when the rule changes
SAMPLE_RULE = 1
#: per-position norms are binned into at most this many runs of consecutive positions
POSITION_BINS = 256
_PLAN_CACHE = 1024
_BIG_ENDIAN = sys.byteorder == "big"


def sequence_dim(shape: tuple[int, ...]) -> int | None:
    """The sequence dimension of a forward tensor of ``shape``, or None when it has none.

    3-d ``(batch, seq, hidden)``: 1; 4-d ``(batch, heads, seq, head_dim)``: 2; a
    dimension of size 1 (one decoding step) has no per-position profile.
    """
    dim = {3: 1, 4: 2}.get(len(shape))
    if dim is None or shape[dim] < 2:
        return None
    return dim


def sample_seed(shape: tuple[int, ...]) -> int:
    """The seed of a shape's sample: a CRC-32 of the shape without size-1 dimensions.

    ``[1, 32, 16]`` and ``[32, 16]`` hold their elements in the same C order, so
    they share their sample, as compare aligns them.
    """
    squeezed = "x".join(str(s) for s in shape if s != 1)
    # the rule's version and sizes are hashed too: samples taken by another rule never
    # share a seed, so compare never pairs elements at different indices
    rule = f"v{SAMPLE_RULE}:{SAMPLE_SIZE}:{STRUCTURED}"
    return zlib.crc32(f"precguard-sample:{rule}:{squeezed}".encode())


def sample_indices(shape: tuple[int, ...]) -> np.ndarray:
    """The sorted flat (C-order) indices sampled from a tensor of ``shape``."""
    numel = math.prod(shape)
    if numel <= SAMPLE_SIZE:
        return np.arange(numel, dtype=np.int64)
    rng = np.random.default_rng(sample_seed(shape))
    chosen = rng.choice(numel, SAMPLE_SIZE, replace=False)
    last = [s - 1 for s in shape]
    seq = sequence_dim(shape)
    structured = []
    for j in range(STRUCTURED):
        at = list(last)
        at[-1] = (j * shape[-1]) // STRUCTURED
        if seq == 2:  # (batch, heads, seq, head_dim): also spread over the heads
            at[1] = (j * shape[1]) // STRUCTURED
        structured.append(int(np.ravel_multi_index(at, shape)))
    fixed = np.unique(np.asarray(structured, dtype=np.int64))
    rest = chosen[~np.isin(chosen, fixed)][: SAMPLE_SIZE - fixed.size]
    return np.sort(np.concatenate([rest, fixed]))


class EvidencePlan(NamedTuple):
    """What to gather from tensors of one shape on one device."""

    seed: int
    index: torch.Tensor
    #: the same indices as a NumPy array (the CPU path gathers with ``np.take``)
    host_index: np.ndarray
    #: sequence dimension, or None when no per-position norms are kept
    seq_dim: int | None
    #: consecutive positions per norm, number of norms, sequence length
    bin: int
    bins: int
    length: int


_PLANS: OrderedDict[tuple[tuple[int, ...], torch.device, bool], EvidencePlan] = OrderedDict()


def plan_for(shape: tuple[int, ...], device: torch.device, positions: bool) -> EvidencePlan:
    """The (cached) :class:`EvidencePlan` of ``shape`` on ``device``."""
    key = (shape, device, positions)
    plan = _PLANS.get(key)
    if plan is not None:
        _PLANS.move_to_end(key)
        return plan
    import torch  # a plan's index tensor; this module itself imports no torch (compare)

    host_index = sample_indices(shape)
    index = torch.from_numpy(host_index).to(device)
    seq = sequence_dim(shape) if positions else None
    length = shape[seq] if seq is not None else 0
    per = max(1, -(-length // POSITION_BINS))
    plan = EvidencePlan(
        seed=sample_seed(shape),
        index=index,
        host_index=host_index,
        seq_dim=seq,
        bin=per,
        bins=-(-length // per) if length else 0,
        length=length,
    )
    _PLANS[key] = plan
    if len(_PLANS) > _PLAN_CACHE:
        _PLANS.popitem(last=False)
    return plan


def gather(x: torch.Tensor, plan: EvidencePlan) -> torch.Tensor:
    """The sampled elements of ``x`` followed by its binned per-position norms, on its device.

    The accelerator (deferred) path's, and a CPU tensor subclass's.

    ``x`` is float32 or float64, detached; ``torch.take`` reads the flat C-order
    indices of any strided layout without copying the tensor.
    """
    import torch

    sample = torch.take(x, plan.index)
    if plan.seq_dim is None:
        return sample
    # The norm over the trailing dims first (contiguous, one fast pass), then the squares
    # summed over the leading ones: a single vector_norm over dims (0, 2) is a strided
    # reduction ~20x slower on the CPU.
    seq = plan.seq_dim
    inner = torch.linalg.vector_norm(x, dim=tuple(range(seq + 1, x.dim())))
    sq = inner.square().sum(dim=tuple(range(seq))) if seq else inner.square()
    if plan.bin > 1:
        pad = plan.bins * plan.bin - plan.length
        if pad:
            sq = torch.nn.functional.pad(sq, (0, pad))
        sq = sq.view(plan.bins, plan.bin).sum(1)
    return torch.cat([sample, sq.sqrt()])


def binned_norms(squares: np.ndarray, plan: EvidencePlan, dtype: np.dtype) -> np.ndarray:
    """Per-position norms in ``dtype`` from per-position sums of squares (the CPU path).

    ``squares`` (float64, one per position) is binned like :func:`gather` does.
    """
    if plan.bin > 1:
        pad = plan.bins * plan.bin - plan.length
        if pad:
            squares = np.pad(squares, (0, pad))
        squares = squares.reshape(plan.bins, plan.bin).sum(1)
    with np.errstate(over="ignore"):  # a norm beyond float32's range is inf there
        return np.sqrt(squares).astype(dtype)


def encode(values: np.ndarray) -> str:
    """Little-endian base64 of ``values`` (float32 or float64): exact and ~5 characters each."""
    if values.dtype.byteorder == ">" or (values.dtype.byteorder == "=" and _BIG_ENDIAN):
        values = values.astype(values.dtype.newbyteorder("<"))
    return b64encode_as_string(np.ascontiguousarray(values))


def record_fields(plan: EvidencePlan, values: np.ndarray) -> dict[str, Any]:
    """The record fields (``sample``, ``positions``) of one tensor's gathered evidence."""
    return all_record_fields([(plan, values)])[0]


def all_record_fields(
    gathered: list[tuple[EvidencePlan, np.ndarray] | None],
) -> list[dict[str, Any] | None]:
    """:func:`record_fields` of each ``(plan, values)`` (None stays None), in one call.

    A flush encodes the evidence of every tensor of a step (two per module call):
    :func:`encode`'s body is inlined here, so the loop calls no Python function.
    """
    out: list[dict[str, Any] | None] = []
    b64 = b64encode_as_string
    f64 = np.float64
    for item in gathered:
        if item is None:
            out.append(None)
            continue
        plan, values = item
        if _BIG_ENDIAN or values.dtype.byteorder == ">":  # rare: encode() swaps the bytes
            fields = _fields_swapped(plan, values)
            out.append(fields)
            continue
        n = plan.host_index.size
        dtype = "float64" if values.dtype == f64 else "float32"  # native order here
        fields = {
            "sample": {
                "seed": plan.seed,
                "dtype": dtype,
                "values": b64(values[:n]),  # a 1-d slice: contiguous, read in place
            }
        }
        if plan.seq_dim is not None:
            fields["positions"] = {
                "dim": plan.seq_dim,
                "bin": plan.bin,
                "length": plan.length,
                "dtype": dtype,
                "norms": b64(values[n:]),
            }
        out.append(fields)
    return out


def _fields_swapped(plan: EvidencePlan, values: np.ndarray) -> dict[str, Any]:
    """:func:`record_fields` through :func:`encode` (which makes the bytes little-endian)."""
    n = plan.host_index.size
    # itemsize, not == np.float64: a big-endian float64 array is one too
    dtype = "float64" if values.dtype.itemsize == 8 else "float32"
    out: dict[str, Any] = {
        "sample": {"seed": plan.seed, "dtype": dtype, "values": encode(values[:n])}
    }
    if plan.seq_dim is not None:
        out["positions"] = {
            "dim": plan.seq_dim,
            "bin": plan.bin,
            "length": plan.length,
            "dtype": dtype,
            "norms": encode(values[n:]),
        }
    return out
