"""A cheap hash of a tensor's bytes, computed on its device, for bitwise comparison.

Two runs that should be bitwise identical (same code, seed, data, determinism
flags) are compared by hashes instead of full tensors: a record's ``hash`` is
16 hex digits, equal for two tensors exactly when their dtype-level bit
patterns in logical (row-major) order are equal, up to a collision chance of
about 2^-62. The hash is of the values, not of the memory: a transposed view
and its contiguous copy hash alike; ``-0.0`` and ``0.0``, or two NaN payloads,
do not.

How: each element's bit pattern is cut into 16-bit limbs, each limb and the
element's position are mixed into a value below the prime ``P = 2^31 - 1``
(integer arithmetic in int64 that never overflows), squared mod ``P`` (so
changes cannot cancel linearly), and summed. Two such sums with different
constants give the hash. Everything is a handful of elementwise int64 kernels
and two sums on the tensor's device; nothing comes to the host until
:meth:`HashBuffer.materialize` fetches all of a step's hashes at once.

``ordered=False`` drops the position from the mix: the hash of the multiset
of elements, equal for any permutation of them (tokens routed to experts in
another order, a gather from ranks in another order).
"""

from __future__ import annotations

import torch

from precguard.backend import capture_scope

#: the Mersenne prime 2^31 - 1: products of two residues fit in int64
_P = 2**31 - 1
#: per-limb and per-position multipliers of the two independent sums (below P)
_LIMB_K = (
    (0x5BD1E995, 0x1B873593, 0x2C1B3C6D, 0x297A2D39),
    (0x3C6EF372, 0x6A09E667, 0x31415926, 0x27182818),
)
_POS_K = (0x4F6CDD1D, 0x2545F491)
_OFFSET = (0x12345679, 0x7654321)

#: the integer dtype whose bit patterns stand for a dtype of that item size
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _words(t: torch.Tensor) -> torch.Tensor:
    """The elements' bit patterns as one flat integer tensor of the same item size."""
    x = t.detach()
    if x.dtype == torch.bool:
        x = x.to(torch.uint8)
    if x.is_complex():
        x = torch.view_as_real(x)
    x = x.contiguous().reshape(-1)
    size = x.element_size()
    bits = _BITS.get(size)
    if bits is None:  # an exotic item size: its bytes
        return x.view(torch.uint8)
    return x if x.dtype == bits else x.view(bits)


def hash_parts(t: torch.Tensor, *, ordered: bool = True) -> torch.Tensor:
    """The two 31-bit sums of ``t``'s hash as an int64 tensor of shape ``(2,)`` on its device.

    No host sync: the caller stacks many of them and fetches them at once
    (:class:`HashBuffer`), or formats one with :func:`format_hash`.
    """
    words = _words(t)
    w = words.to(torch.int64)
    limbs = max(1, words.element_size() // 2)
    pos = torch.arange(w.numel(), device=w.device, dtype=torch.int64) % _P if ordered else None
    sums = []
    for k in range(2):
        acc = torch.full_like(w, _OFFSET[k])
        for j in range(limbs):
            # the limb is below 2^16 and the constant below 2^31: no overflow
            acc += ((w >> (16 * j)) & 0xFFFF) * _LIMB_K[k][j]
        if pos is not None:
            acc += pos * _POS_K[k]
        acc %= _P
        acc = acc * acc % _P  # below 2^62: fits
        sums.append(acc.sum() % _P)  # n < 2^32 terms below 2^31: fits
    return torch.stack(sums)


def format_hash(parts: list[int] | tuple[int, ...] | torch.Tensor) -> str:
    """16 hex digits from the two sums of :func:`hash_parts`."""
    a, b = (int(v) for v in (parts.tolist() if isinstance(parts, torch.Tensor) else parts))
    return f"{a:08x}{b:08x}"


def tensor_hash(t: torch.Tensor, *, ordered: bool = True) -> str:
    """The hash of ``t`` as 16 hex digits (one host sync; batch with :class:`HashBuffer`).

    >>> tensor_hash(torch.zeros(3)) == tensor_hash(torch.zeros(3))
    True
    """
    return format_hash(hash_parts(t, ordered=ordered))


class HashBuffer:
    """Queues the hashes of many tensors and fetches them in one transfer per device."""

    def __init__(self) -> None:
        self._parts: list[torch.Tensor] = []

    def __len__(self) -> int:
        return len(self._parts)

    def add(self, t: torch.Tensor) -> int:
        """Queue the hash of ``t`` (computed now, on its device); return its slot."""
        with capture_scope():  # precguard's own work: op-level capture must not record it
            self._parts.append(hash_parts(t))
        return len(self._parts) - 1

    def materialize(self) -> list[str]:
        """Every queued hash in slot order, as hex strings; empties the buffer."""
        if not self._parts:
            return []
        # The stack and the transfer are precguard's own ops: outside capture_scope,
        # op-level capture (``level="both"``) recorded them as the user's, each record
        # queueing a hash into this buffer while it was being emptied (issue 31).
        with capture_scope():
            rows = self._fetch()
        self._parts = []
        return [format_hash(r) for r in rows]

    def _fetch(self) -> list[list[int]]:
        """The two sums of every queued hash, one transfer per device."""
        by_device: dict[torch.device, list[int]] = {}
        for i, p in enumerate(self._parts):
            by_device.setdefault(p.device, []).append(i)
        rows: list[list[int]] = [[] for _ in self._parts]
        for idx in by_device.values():
            fetched = torch.stack([self._parts[i] for i in idx]).cpu().tolist()
            for i, row in zip(idx, fetched, strict=True):
                rows[i] = row
        return rows

    def clear(self) -> None:
        """Drop every queued hash."""
        self._parts = []
