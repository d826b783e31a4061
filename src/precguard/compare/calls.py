"""A step's module calls, grouped once as the one pass (verdict.py) reads the records.

:class:`StepCalls` is built as the records are settled one by one: the judge (judge.py)
reads what a call consumed and its reduction length K, the local/propagated decision
(divergence.py) the calls with a failing record once the step is settled. It holds the
step's records as compact rows (:class:`~precguard.compare.report.RecordRows`), each settled
one written in its measured form's place, and reads a record when it is used: a step may
hold millions, and one settled again later (a router's follower, routing.py) is seen in
its final form. For the same reason a call is no object: module names are numbered
(:class:`ModuleIds`) and each call is a row of arrays (:class:`_Calls`) whose records are
linked lists of positions (docs/compare.md, "One big step").
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from precguard.compare.report import RecordResult, RecordRows, Status
from precguard.numerics import reduction_length

CallKey = tuple[str, int]

#: the statuses of a record in error
BAD: tuple[Status, ...] = ("fail", "nonfinite")

_END = -1  # the end of a list of positions; no call; no K (reduction_length's None)


_GOLDEN = 0x9E3779B97F4A7C15  # Fibonacci hashing: 2**64 / the golden ratio
_MASK64 = (1 << 64) - 1


class _Links:
    """A hash table from a non-negative int key to an int, in two arrays (open addressing,
    linear probing): 12 bytes a slot, 3-4 slots a key filled 1/4 to 2/3; a dict holds an
    int object for each key and value besides its slot, ~100 bytes a key."""

    def __init__(self) -> None:
        self._bits = 3
        self._keys = array("q", [_END]) * (1 << self._bits)
        self._values = array("i", [0]) * (1 << self._bits)
        self._filled = 0

    def _slot(self, key: int) -> int:
        keys = self._keys
        mask = len(keys) - 1
        i = ((key * _GOLDEN) & _MASK64) >> (64 - self._bits)
        while True:
            k = keys[i]
            if k in (key, _END):
                return i
            i = (i + 1) & mask

    def get(self, key: int) -> int:
        """The value of ``key``, or _END."""
        i = self._slot(key)
        return self._values[i] if self._keys[i] == key else _END

    def put(self, key: int, value: int) -> None:
        """Set the value of ``key`` (a key not in the table)."""
        if 3 * (self._filled + 1) > 2 * len(self._keys):
            keys, values = self._keys, self._values
            self._bits += 1
            self._keys = array("q", [_END]) * (1 << self._bits)
            self._values = array("i", [0]) * (1 << self._bits)
            for k, v in zip(keys, values, strict=True):
                if k != _END:
                    i = self._slot(k)
                    self._keys[i], self._values[i] = k, v
        i = self._slot(key)
        self._keys[i], self._values[i] = key, value
        self._filled += 1

    def __len__(self) -> int:
        return self._filled


class ModuleIds:
    """Numbers for module names: a module and every module enclosing it by name, each once.

    A name is numbered as the chain of its dotted parts (``a.b.c``: ``a``, then ``b`` in
    ``a``, then ``c`` in ``a.b``), each link a pair of numbers in a table of arrays, so a
    step's millions of module names are held as a few bytes each and not as strings
    (docs/compare.md, "One big step"). Two names get the same number exactly when they are
    the same string.
    """

    def __init__(self) -> None:
        self._parts: dict[str, int] = {}  # a dotted part's number (a handful per model)
        self._links = _Links()  # (enclosing + 1) << 32 | part: the module's number
        self._last: tuple[str, list[int]] = ("", [])
        self.root = self.number("root")

    @property
    def count(self) -> int:
        """How many modules are numbered (0 .. count - 1)."""
        return len(self._links)

    def chain(self, module: str) -> list[int]:
        """The numbers of ``module`` and of every name enclosing it, innermost first (not
        ``root`` unless ``module`` is under it); numbers them when new. Do not change the
        list: the last one is reused (a call's records come one after another)."""
        if module == self._last[0]:
            return self._last[1]
        links = self._links
        ids: list[int] = []
        enclosing = 0  # the enclosing module's number + 1; 0: none
        for part in module.split("."):
            p = self._parts.setdefault(part, len(self._parts))
            link = enclosing << 32 | p
            i = links.get(link)
            if i == _END:
                i = len(links)
                links.put(link, i)
            ids.append(i)
            enclosing = i + 1
        ids.reverse()
        self._last = (module, ids)
        return ids

    def number(self, module: str) -> int:
        """The number of ``module`` (numbered when new)."""
        return self.chain(module)[0]

    def ancestors(self, module: str) -> list[int]:
        """The numbers of ``module`` and every module enclosing it, innermost first, ending
        with ``root`` (judge.py's ``_ancestors``, numbered)."""
        ids = self.chain(module)
        return ids if module == "root" else [*ids, self.root]


class _Calls:
    """One phase's module calls, numbered in the order of their first record, held in
    arrays by number (a big step holds millions: no object per call)."""

    def __init__(self) -> None:
        self.first = array("i")  # per module number: the number of its call 0, or _END
        self.later: dict[int, int] = {}  # module number | call << 32: calls after the first
        self.module = array("i")  # per call: its module's number
        self.type = array("i")  # its module type's number in StepCalls.types
        self.index = array("q")  # its call index (RecordResult.call)
        #: its lists of positions (heads and tails, _END when empty; linked by
        #: StepCalls.next): forward: inputs, buffers and parameters in capture order, and
        #: outputs; backward: the gradients w.r.t. its outputs, and the rest
        self.reads = array("i")
        self.reads_tail = array("i")
        self.produced = array("i")
        self.produced_tail = array("i")
        self.n_reads = array("i")
        #: K, computed once per call (_END: None): when the forward call held k_reads reads
        self.k = array("q")
        self.k_reads = array("i")

    def __len__(self) -> int:
        return len(self.module)

    def find(self, module: int, call: int) -> int:
        """The number of call ``call`` of module number ``module``, or _END."""
        if call == 0:
            return self.first[module] if module < len(self.first) else _END
        return self.later.get(module | call << 32, _END)

    def make(self, module: int, call: int, type_no: int) -> int:
        """Number a new call (:meth:`find` found none)."""
        n = len(self.module)
        if call == 0:
            if module >= len(self.first):
                self.first.extend([_END] * (module + 1 - len(self.first)))
            self.first[module] = n
        else:
            self.later[module | call << 32] = n
        self.module.append(module)
        self.type.append(type_no)
        self.index.append(call)
        for column in (self.reads, self.reads_tail, self.produced, self.produced_tail):
            column.append(_END)
        self.n_reads.append(0)
        self.k.append(_END)
        self.k_reads.append(-1)
        return n


@dataclass
class CallRecords:
    """One module call's records, as the local/propagated decision reads them."""

    module: str
    module_type: str
    phase: str
    call: int
    #: forward: inputs and buffers; backward: output gradients, then the forward
    #: call's inputs, buffers and parameters (a backward also reads its forward records)
    consumed: list[RecordResult]
    #: forward: its parameters
    params: list[RecordResult]
    produced: list[RecordResult]
    #: backward: whether the gradients w.r.t. its outputs were recorded
    has_output_grads: bool
    #: the reduction length of what its forward call consumed (the judge's K)
    k: int | None


class StepCalls:
    """The records of one rank and step, settled in capture order, grouped into calls.

    Each call's records are held as linked lists of positions in arrays (:class:`_Calls`),
    its module by number (:class:`ModuleIds`): a few dozen bytes a call."""

    def __init__(self, records: RecordRows) -> None:
        #: the step's records, the first :attr:`settled` of them in their settled form
        self.records = records
        self.settled = 0
        #: the step's module names, numbered (the judge numbers its scopes by them too)
        self.modules = ModuleIds()
        #: per position: the next position in the same list of its call, or _END
        self.next = array("i")
        self.types: list[str] = []  # module types, numbered
        self._type_numbers: dict[str, int] = {}
        self._forward = _Calls()
        self._backward = _Calls()
        #: gradients w.r.t. module inputs are recorded for the whole run or not at all
        self.input_grads = False

    def number(self, r: RecordResult) -> int:
        """The number of ``r``'s call among the calls of its phase (forward or backward),
        numbered when new: calls are numbered in the order of their first record."""
        calls = self._forward if r.phase == "forward" else self._backward
        module = self.modules.number(r.module)
        n = calls.find(module, r.call)
        if n == _END:
            type_no = self._type_numbers.get(r.module_type)
            if type_no is None:
                type_no = self._type_numbers[r.module_type] = len(self.types)
                self.types.append(r.module_type)
            n = calls.make(module, r.call, type_no)
        return n

    def forward_number(self, key: CallKey) -> int:
        """The number of the forward call ``key`` (:meth:`number`), or -1 when it has no
        record yet."""
        return self._forward.find(self.modules.number(key[0]), key[1])

    def add(self, r: RecordResult) -> int:
        """Take in the next record settled (in capture order), in its measured form's place;
        return its position."""
        pos = self.settled
        self.records[pos] = r
        self.settled += 1
        self.next.append(_END)
        if r.phase == "backward" and r.role == "input":
            self.input_grads = True
        if r.metrics is None:
            return pos
        n = self.number(r)
        if r.phase == "forward":
            calls, read = self._forward, r.role != "output"
        else:  # the gradient w.r.t. a forward output is what backward consumes
            calls, read = self._backward, r.role == "output"
        heads, tails = calls.reads, calls.reads_tail
        if not read:
            heads, tails = calls.produced, calls.produced_tail
        if tails[n] == _END:
            heads[n] = pos
        else:
            self.next[tails[n]] = pos
        tails[n] = pos
        if read:
            calls.n_reads[n] += 1
        return pos

    def _positions(self, head: int) -> Iterator[int]:
        while head != _END:
            yield head
            head = self.next[head]

    def opened(self, key: CallKey) -> bool:
        """Whether an input, buffer or parameter of the forward call ``key`` was settled."""
        n = self.forward_number(key)
        return n != _END and self._forward.n_reads[n] > 0

    def reads(self, key: CallKey) -> list[RecordResult]:
        """A forward call's inputs, buffers and parameters recorded so far, in capture order."""
        n = self.forward_number(key)
        return [] if n == _END else self._records(self._forward.reads[n])

    def output_grads(self, key: CallKey) -> list[RecordResult]:
        """The gradients w.r.t. a call's outputs recorded so far."""
        n = self._backward.find(self.modules.number(key[0]), key[1])
        return [] if n == _END else self._records(self._backward.reads[n])

    def _records(self, head: int) -> list[RecordResult]:
        return [self.records[i] for i in self._positions(head)]

    def reduction(self, key: CallKey, backward: bool) -> int | None:
        """K of the call ``key``: :func:`~precguard.numerics.reduction_length` of the shapes
        its forward call consumed (inputs, buffers, parameters), once per call and phase."""
        module = self.modules.number(key[0])
        n = self._forward.find(module, key[1])
        if n == _END:
            return reduction_length((), backward=backward)
        owner, at = self._forward, n
        if backward:
            owner, at = self._backward, self._backward.find(module, key[1])
            if at == _END:  # no backward record of the call yet: nothing to keep it on
                return reduction_length(self._shapes(n), backward=True)
        reads = self._forward.n_reads[n]
        if owner.k_reads[at] != reads:
            k = reduction_length(self._shapes(n), backward=backward)
            owner.k[at] = _END if k is None else k
            owner.k_reads[at] = reads
        k = owner.k[at]
        return None if k == _END else k

    def _shapes(self, forward: int) -> list[list[int]]:
        return [r.shape for r in self._records(self._forward.reads[forward])]

    def failing_calls(self) -> Iterator[CallRecords]:
        """The records of every call with a failing record (:data:`BAD`) among them, as
        settled now: forward calls, then backward calls, each in the order of their first
        record. A call without one has nothing to decide: its records are not read."""
        failing = set(self.records.where(BAD))
        if not failing:
            return
        for backward, calls in ((False, self._forward), (True, self._backward)):
            for n in range(len(calls)):
                own = [*self._positions(calls.reads[n]), *self._positions(calls.produced[n])]
                if not own:  # numbered (StepJudge numbers calls ahead), nothing settled yet
                    continue
                positions = own
                fn = self._forward.find(calls.module[n], calls.index[n]) if backward else n
                if backward and fn != _END:  # a backward also reads its forward records
                    positions = [*own, *self._positions(self._forward.reads[fn])]
                if failing.isdisjoint(positions):
                    continue
                module = self.records[own[0]].module
                key = (module, calls.index[n])
                reads = [] if fn == _END else self._records(self._forward.reads[fn])
                inputs = [r for r in reads if r.role != "param"]
                params = [r for r in reads if r.role == "param"]
                grads = self._records(calls.reads[n]) if backward else []
                yield CallRecords(
                    module,
                    self.types[calls.type[n]],
                    "backward" if backward else "forward",
                    calls.index[n],
                    consumed=[*grads, *inputs, *params] if backward else inputs,
                    params=[] if backward else params,
                    produced=self._records(calls.produced[n]),
                    has_output_grads=bool(grads),
                    k=self.reduction(key, backward=backward),
                )
