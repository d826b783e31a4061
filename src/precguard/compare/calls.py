"""A step's module calls, grouped once as the one pass (verdict.py) reads the records.

:class:`StepCalls` is built as the records are settled one by one: the judge (judge.py)
reads what a call consumed and its reduction length K, the local/propagated decision
(divergence.py) the calls with a failing record once the step is settled. It holds the
step's records as compact rows (:class:`~precguard.compare.report.RecordRows`), each settled
one written in its measured form's place, and reads a record when it is used: a step may
hold millions, and one settled again later (a router's follower, routing.py) is seen in
its final form.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from precguard.compare.report import RecordResult, RecordRows, Status
from precguard.numerics import reduction_length

CallKey = tuple[str, int]

#: the statuses of a record in error
BAD: tuple[Status, ...] = ("fail", "nonfinite")


@dataclass(slots=True)  # one per module call of a step (millions in a big one)
class _Call:
    """One module call: positions of its records in :attr:`StepCalls.records`."""

    module: str
    module_type: str
    phase: str
    #: forward: its inputs, buffers and parameters in capture order; backward: the
    #: gradients w.r.t. its outputs
    reads: list[int] = field(default_factory=list)
    produced: list[int] = field(default_factory=list)
    #: K, computed once per call: when ``reads`` held ``k_reads`` records
    k: int | None = None
    k_reads: int = -1


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
    """The records of one rank and step, settled in capture order, grouped into calls."""

    def __init__(self, records: RecordRows) -> None:
        #: the step's records, the first :attr:`settled` of them in their settled form
        self.records = records
        self.settled = 0
        self._forward: dict[CallKey, _Call] = {}
        self._backward: dict[CallKey, _Call] = {}
        #: gradients w.r.t. module inputs are recorded for the whole run or not at all
        self.input_grads = False

    def add(self, r: RecordResult) -> int:
        """Take in the next record settled (in capture order), in its measured form's place;
        return its position."""
        pos = self.settled
        self.records[pos] = r
        self.settled += 1
        if r.phase == "backward" and r.role == "input":
            self.input_grads = True
        if r.metrics is None:
            return pos
        key = (r.module, r.call)
        if r.phase == "forward":
            call = self._forward.setdefault(key, _Call(r.module, r.module_type, "forward"))
            (call.produced if r.role == "output" else call.reads).append(pos)
        else:
            call = self._backward.setdefault(key, _Call(r.module, r.module_type, "backward"))
            # the gradient w.r.t. a forward output is what backward consumes
            (call.reads if r.role == "output" else call.produced).append(pos)
        return pos

    def opened(self, key: CallKey) -> bool:
        """Whether an input, buffer or parameter of the forward call ``key`` was settled."""
        call = self._forward.get(key)
        return call is not None and len(call.reads) > 0

    def reads(self, key: CallKey) -> list[RecordResult]:
        """A forward call's inputs, buffers and parameters recorded so far, in capture order."""
        call = self._forward.get(key)
        return [] if call is None else [self.records[i] for i in call.reads]

    def output_grads(self, key: CallKey) -> list[RecordResult]:
        """The gradients w.r.t. a call's outputs recorded so far."""
        call = self._backward.get(key)
        return [] if call is None else [self.records[i] for i in call.reads]

    def reduction(self, key: CallKey, backward: bool) -> int | None:
        """K of the call ``key``: :func:`~precguard.numerics.reduction_length` of the shapes
        its forward call consumed (inputs, buffers, parameters), once per call and phase."""
        call = self._forward.get(key)
        if call is None:
            return reduction_length((), backward=backward)
        owner = self._backward.get(key) if backward else call
        if owner is None:  # no backward record of the call yet: nothing to keep it on
            return reduction_length(self._shapes(call), backward=True)
        if owner.k_reads != len(call.reads):
            owner.k = reduction_length(self._shapes(call), backward=backward)
            owner.k_reads = len(call.reads)
        return owner.k

    def _shapes(self, call: _Call) -> list[list[int]]:
        return [self.records[i].shape for i in call.reads]

    def failing_calls(self) -> Iterator[CallRecords]:
        """The records of every call with a failing record (:data:`BAD`) among them, as
        settled now: forward calls, then backward calls, each in the order of their first
        record. A call without one has nothing to decide: its records are not read."""
        failing = set(self.records.where(BAD))
        for backward, calls in ((False, self._forward), (True, self._backward)):
            for (module, n), call in calls.items():
                positions = [*call.reads, *call.produced]
                if backward and (forward := self._forward.get((module, n))) is not None:
                    positions += forward.reads  # a backward also reads its forward records
                if failing.isdisjoint(positions):
                    continue
                reads = self.reads((module, n))
                inputs = [r for r in reads if r.role != "param"]
                params = [r for r in reads if r.role == "param"]
                grads = [self.records[i] for i in call.reads] if backward else []
                yield CallRecords(
                    module,
                    call.module_type,
                    call.phase,
                    n,
                    consumed=[*grads, *inputs, *params] if backward else inputs,
                    params=[] if backward else params,
                    produced=[self.records[i] for i in call.produced],
                    has_output_grads=bool(grads),
                    k=self.reduction((module, n), backward=backward),
                )
