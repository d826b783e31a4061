"""Decide which module introduced an error: local versus propagated.

Within one rank and step, the forward records of a module call are its
inputs and parameters (captured before it runs) and its outputs (captured
after). A module call is **local** when an output fails and either every
input and parameter passed, or the output error is at least
``profile.amplification`` times the largest input error (floored at the
dtype's unit roundoff, so an exact input does not divide by zero). A failing
parameter makes its module local by itself: the module's own state differs.
A module whose inputs passed but which grew their error less than 2x is not
local: error it received merely crossed the threshold at its output.

The first divergence is the first local call in execution order, where a
call's place is its first failing output (children finish before their
parent). A local call that contains an earlier local call of the same step
is explained by it and is not listed again. When nothing is local (the root's
own inputs differ: the runs were fed different data) the first failing
record is named with ``local=False``.

Backward is judged the same way with the roles turned around: a module's
backward consumes the gradients of its outputs (``backward.output``) and
produces those of its inputs (``backward.input``) and parameters
(``backward.grad``, keyed at call 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from precguard.compare.report import FirstDivergence, RecordResult, Suspect
from precguard.compare.tolerance import Profile, unit_roundoff

_BAD = ("fail", "nonfinite")
#: a module whose inputs passed is local only if it at least doubled their error; below
#: that, propagated error merely crossed the threshold there
MIN_LOCAL_GROWTH = 2.0


@dataclass
class Candidate:
    """A module call that introduced error (or, failing that, the first failing record)."""

    result: RecordResult
    local: bool | None
    amplification: float | None
    input_error: float | None
    reason: str

    @property
    def order(self) -> tuple[int, bool, int, int]:
        """Where it sits in execution: step, forward before backward, capture order, rank."""
        r = self.result
        return r.step, r.phase != "forward", r.seq, r.rank

    def divergence(self) -> FirstDivergence:
        """As the report's first divergence."""
        r = self.result
        assert r.metrics is not None
        return FirstDivergence(
            key=r.key,
            module=r.module,
            module_type=r.module_type,
            step=r.step,
            rank=r.rank,
            phase=r.phase,
            metrics=r.metrics,
            local=self.local,
            amplification=self.amplification,
            input_error=self.input_error,
            reason=self.reason,
        )

    def suspect(self) -> Suspect:
        """As one entry of the report's suspects."""
        r = self.result
        assert r.metrics is not None
        return Suspect(
            module=r.module,
            module_type=r.module_type,
            key=r.key,
            step=r.step,
            rank=r.rank,
            amplification=self.amplification,
            error=r.metrics.error,
            reason=self.reason,
        )


@dataclass
class _Call:
    module: str
    module_type: str
    inputs: list[RecordResult] = field(default_factory=list)
    params: list[RecordResult] = field(default_factory=list)
    outputs: list[RecordResult] = field(default_factory=list)


def _err(r: RecordResult) -> float:
    m = r.metrics
    if m is None:
        return 0.0
    if m.level == "exact":
        return 1.0 if m.mismatched else 0.0  # different ids/positions: different data
    return m.error if math.isfinite(m.error) else math.inf


def _fmt(x: float) -> str:
    return f"{x:.3g}"


#: record key -> (local, amplification) for every failing forward output and parameter
Classification = dict[str, tuple[bool, float | None]]


def step_candidates(
    results: list[RecordResult], profile: Profile, classified: Classification | None = None
) -> list[Candidate]:
    """Local candidates of one rank and step, in execution order (see the module doc).

    ``classified``, if given, receives the local/propagated decision and the
    amplification of every failing forward output and parameter record.
    """
    classified = {} if classified is None else classified
    forward = [r for r in results if r.phase == "forward" and r.metrics is not None]
    calls: dict[tuple[str, int], _Call] = {}
    for r in forward:
        call_index = int(r.key.rsplit(".", 4)[1]) if r.key.count(".") >= 4 else 0
        call = calls.setdefault((r.module, call_index), _Call(r.module, r.module_type))
        {"input": call.inputs, "param": call.params, "output": call.outputs}.get(
            r.role, call.inputs
        ).append(r)
    found: list[Candidate] = []
    for call in calls.values():
        bad_params = [p for p in call.params if p.status in _BAD]
        for p in bad_params:
            classified[p.key] = (True, None)
        for p in bad_params[:1]:
            cast = (
                f", stored as {p.actual_dtype} where golden has {p.golden_dtype}"
                if p.actual_dtype and p.actual_dtype != p.golden_dtype
                else ""
            )
            found.append(
                Candidate(
                    p,
                    True,
                    None,
                    None,
                    f"{call.module} ({call.module_type}) holds a parameter that differs from "
                    f"golden (error {_fmt(_err(p))}{cast}): its weights, not its inputs, differ",
                )
            )
        bad_outputs = [o for o in call.outputs if o.status in _BAD]
        if not bad_outputs or bad_params:
            continue
        first = bad_outputs[0]
        tol_dtype = first.metrics.dtype if first.metrics else "float32"
        in_records = call.inputs + call.params
        in_err = max((_err(r) for r in in_records), default=0.0)
        out_err = max(_err(o) for o in call.outputs)
        amp = out_err / max(in_err, unit_roundoff(tol_dtype))
        reason = _local_reason(call, in_records, first, forward, in_err, out_err, amp, profile)
        for o in bad_outputs:
            classified[o.key] = (reason is not None, amp)
        if reason is None:
            continue
        found.append(Candidate(first, True, amp, in_err, reason))
    found.extend(_backward_candidates(results, profile, classified))
    found.sort(key=lambda c: c.order)
    return _drop_explained(found)


def _backward_candidates(
    results: list[RecordResult], profile: Profile, classified: Classification
) -> list[Candidate]:
    """Module calls whose backward made error: output gradients in, input/param gradients out."""
    calls: dict[tuple[str, int], _Call] = {}
    for r in results:
        if r.phase != "backward" or r.metrics is None:
            continue
        call_index = int(r.key.rsplit(".", 4)[1]) if r.key.count(".") >= 4 else 0
        call = calls.setdefault((r.module, call_index), _Call(r.module, r.module_type))
        (call.inputs if r.role == "output" else call.outputs).append(r)
    found: list[Candidate] = []
    for call in calls.values():
        bad = [o for o in call.outputs if o.status in _BAD]
        if not bad or not call.inputs:
            continue  # nothing wrong, or nothing to tell local from propagated
        first = min(bad, key=lambda r: r.seq)
        tol_dtype = first.metrics.dtype if first.metrics else "float32"
        in_err = max(_err(r) for r in call.inputs)
        out_err = max(_err(o) for o in call.outputs)
        amp = out_err / max(in_err, unit_roundoff(tol_dtype))
        inputs_bad = any(r.status in _BAD for r in call.inputs)
        local = (not inputs_bad and amp >= MIN_LOCAL_GROWTH) or amp >= profile.amplification
        for o in bad:
            classified[o.key] = (local, amp)
        if not local:
            continue
        made = "parameter" if first.role == "grad" else "input"
        found.append(
            Candidate(
                first,
                True,
                amp,
                in_err,
                f"{call.module} ({call.module_type}) backward: the gradients of its outputs "
                f"{'match' if not inputs_bad else 'differ'} (error {_fmt(in_err)}) but the "
                f"{made} gradients it computes do not (error {_fmt(out_err)}, "
                f"{_fmt(amp)}x amplification)",
            )
        )
    return found


def _local_reason(
    call: _Call,
    in_records: list[RecordResult],
    first: RecordResult,
    forward: list[RecordResult],
    in_err: float,
    out_err: float,
    amp: float,
    profile: Profile,
) -> str | None:
    """Why ``call`` made error of its own, or None when it only passed error on."""
    if first.status == "nonfinite" and not any(r.status == "nonfinite" for r in in_records):
        return (
            f"{call.module} ({call.module_type}) produced NaN/Inf where golden has none "
            "(or the reverse) from inputs without such a mismatch"
        )
    inputs_bad = any(r.status in _BAD for r in in_records)
    if not inputs_bad and amp >= MIN_LOCAL_GROWTH:
        return (
            f"{call.module} ({call.module_type}): inputs match (error {_fmt(in_err)}) but "
            f"its output does not (error {_fmt(out_err)}, {_fmt(amp)}x amplification)"
            + _glue_note(call, in_records, first, forward)
        )
    if amp >= profile.amplification:
        return (
            f"{call.module} ({call.module_type}) amplified the error of its inputs "
            f"{_fmt(amp)}x ({_fmt(in_err)} -> {_fmt(out_err)}), threshold "
            f"{_fmt(profile.amplification)}x"
        )
    return None


def _glue_note(
    call: _Call, in_records: list[RecordResult], first: RecordResult, forward: list[RecordResult]
) -> str:
    """Say so when the error first shows in a submodule's input: the module's own code made it."""
    start = min((r.seq for r in in_records), default=-1)
    for r in forward:
        if not start < r.seq < first.seq or r.status not in _BAD:
            continue
        if r.role == "input" and _contains(call.module, r.module):
            return (
                f"; it first shows in the input of {r.module}, so {call.module}'s own code "
                "between its submodules made it"
            )
        return ""
    return ""


def _contains(outer: str, inner: str) -> bool:
    """True when module ``inner`` lies inside ``outer``.

    Keys write the root module as ``root``, not as the empty prefix of every
    name, so it is the one module a prefix test alone would miss.
    """
    return outer == "root" or inner.startswith(outer + ".")


def _drop_explained(found: list[Candidate]) -> list[Candidate]:
    """Drop calls that contain an earlier candidate: the submodule explains them."""
    kept: list[Candidate] = []
    for c in found:
        if any(
            k.result.step == c.result.step
            and k.result.rank == c.result.rank
            and _contains(c.result.module, k.result.module)
            for k in kept
        ):
            continue
        kept.append(c)
    return kept


def fallback(results: list[RecordResult]) -> Candidate | None:
    """The first failing record when no module is local (or in backward)."""
    for phase in ("forward", "backward"):
        for r in results:
            if r.phase != phase or r.status not in _BAD:
                continue
            if phase == "backward":
                reason = (
                    f"first failing gradient, at {r.module} ({r.module_type}); no module's "
                    "backward made error of its own that the recorded gradients can show"
                )
                local: bool | None = None
            elif r.role == "input" and (
                r.module == "root" or (r.metrics is not None and r.metrics.level == "exact")
            ):
                reason = (
                    f"the input of {r.module} ({r.module_type}) already differs and no module "
                    "made error of its own: the two runs were probably fed different data"
                )
                local = False
            else:
                reason = (
                    f"error grew gradually: no module made error of its own (none amplified its "
                    f"input error >= the threshold); {r.module} ({r.module_type}) is the first "
                    "record outside tolerance"
                )
                local = False
            return Candidate(r, local, None, None, reason)
    return None


def rank_suspects(cands: list[Candidate], first: Candidate | None, top: int) -> list[Suspect]:
    """Candidates other than ``first``, the most amplifying first, differing weights last."""
    rest = [c for c in cands if c is not first]
    rest.sort(key=lambda c: (c.amplification is None, -(c.amplification or 0.0), c.order))
    return [c.suspect() for c in rest[:top]]
