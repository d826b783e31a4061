"""Decide which module introduced an error: local versus propagated.

Within one rank and step a module call consumes some records and produces others
(compare/calls.py). A call is **local** when a produced record fails and its consumed
records all pass and the error is at least twice the expected error
(:func:`precguard.numerics.expected_error`), or the error is at least
``profile.amplification`` times it, or it carries a scale error its inputs cannot
explain (:func:`precguard.compare.expected.own_bias`), or it produced NaN/Inf from finite
inputs; a failing parameter or buffer makes its module local by itself. The first
divergence is the first local call in execution order; a call that contains an earlier
local call of the same phase is explained by it; with none local, the first failing
record is named (:func:`fallback`). docs/compare.md, "Local or propagated", tells it in
full. This module also writes the why lines and ranks the suspects.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from pydantic import BaseModel, ConfigDict

from precguard.compare.advice import Advice, candidates
from precguard.compare.align import parent_module
from precguard.compare.caches import Read, cache_read, cache_written, stored_as
from precguard.compare.calls import BAD as _BAD
from precguard.compare.calls import CallRecords, StepCalls
from precguard.compare.expected import LINEAR_TYPES, carried_bias, linear_factors, own_bias
from precguard.compare.levels import FullMetrics, MeasuredMetrics, Metrics
from precguard.compare.optimizer import is_optimizer
from precguard.compare.report import FirstDivergence, RecordResult, Suspect
from precguard.compare.routing import index_reason, is_routing_finding
from precguard.compare.tolerance import Profile
from precguard.numerics import CONCENTRATION, MIN_LOCAL_GROWTH, expected_error, rounding_floor


class Candidate(BaseModel):
    """A module call that introduced error (or, failing that, the first failing record).
    Frozen: its why is written once, by :func:`decide_calls`; merging ranks only selects
    among the candidates (:func:`decide_ranks`)."""

    model_config = ConfigDict(ser_json_inf_nan="strings", frozen=True)

    result: RecordResult
    local: bool | None
    amplification: float | None = None
    input_error: float | None = None
    reason: str
    expected_error: float | None = None
    #: its candidate remedies, in the order --verify tries them (compare/advice.py)
    remedies: list[Advice] = []

    @property
    def order(self) -> tuple[int, bool, int, int]:
        """Where it sits in execution: step, forward before backward, capture order, rank."""
        r = self.result
        return r.step, r.phase != "forward", r.seq, r.rank

    @property
    def confidence(self) -> str:
        """'full' when judged on full tensors, 'statistics' when only statistics were compared."""
        m = self.result.metrics
        return "statistics" if m is not None and m.level == "stats" else "full"

    def divergence(self) -> FirstDivergence:
        """As the report's first divergence (``settle_with``: the ``--tensors`` glob whose
        full tensors would settle a statistics-only verdict)."""
        r = self.result
        assert r.metrics is not None
        settle_with = None
        if self.confidence == "statistics":
            settle_with = "*" if r.module == "root" else f"{r.module}.*"
        return FirstDivergence(
            **r.identity_fields(),
            metrics=r.metrics,
            local=self.local,
            amplification=self.amplification,
            input_error=self.input_error,
            expected_error=self.expected_error,
            confidence=self.confidence,
            settle_with=settle_with,
            reason=self.reason,
            remedies=self.remedies,
        )

    def suspect(self) -> Suspect:
        """As one entry of the report's suspects."""
        r = self.result
        assert r.metrics is not None
        return Suspect(
            **r.identity_fields(),
            amplification=self.amplification,
            error=r.metrics.error,
            expected_error=self.expected_error,
            scale=r.metrics.scale if isinstance(r.metrics, MeasuredMetrics) else None,
            confidence=self.confidence,
            reason=self.reason,
            remedies=self.remedies,
        )


class UnitLike(Protocol):
    """One compared (rank, step): what :func:`decoding_divergence` reads of it."""

    rank: int
    step: int
    results: Iterable[RecordResult]


def _err(r: RecordResult) -> float:
    m = r.metrics
    if m is None:
        return 0.0
    if m.level == "exact":
        if m.rerouted is not None:  # a router's indices: judged from its scores (routing.py)
            return 0.0 if r.status == "pass" else math.inf  # a wrong routing explains all after
        return 1.0 if m.mismatched else 0.0  # different ids/positions: different data
    return m.error if math.isfinite(m.error) else math.inf


def _fmt(x: float) -> str:
    return f"{x:.3g}"


@dataclass(frozen=True)
class Decision:
    """The local/propagated decision on one failing produced record or parameter."""

    local: bool | None
    amplification: float | None
    expected_error: float | None


def decide_calls(
    calls: StepCalls,
    profile: Profile,
    names: dict[str, str] | None = None,
    settled: dict[str, Candidate] | None = None,
    cache_names: dict[str, str] | None = None,
) -> tuple[list[Candidate], dict[str, Decision]]:
    """Decide every call of a step: its local candidates (in execution order, explained
    ones dropped) and the decision on each failing produced record and parameter, by key.
    ``names`` and ``cache_names``: the names the why lines give buffer and KV-cache records,
    by key. ``settled``: records a rule decided already (a loss computed in low precision,
    loss.py), by key: never explained by a submodule, and no part of their call's decision.
    """
    settled = settled or {}
    failing = list(calls.records.having(_BAD))
    forward = [r for r in failing if r.phase == "forward"]
    step = _Step(profile, names or {}, cache_names or {}, forward)
    step.decisions.update(dict.fromkeys(settled, Decision(True, None, None)))
    found: list[Candidate] = []
    for call in calls.failing_calls():
        bad = [o for o in call.produced if o.status in _BAD and o.key not in settled]
        found.extend(step.decide(call, bad, calls.input_grads))
    found.extend(settled.values())
    found.sort(key=lambda c: c.order)
    kept = _drop_explained(found, keep=set(settled))
    if any(_collective_call(r) for r in failing):
        kept = [_fed_collective(c) for c in kept]
    return kept, step.decisions


@dataclass
class _Step:
    """One step's calls being decided (:func:`decide_calls`)."""

    profile: Profile
    names: dict[str, str]
    cache_names: dict[str, str]
    #: the step's failing forward records (the only ones the why lines read besides a
    #: call's own)
    forward: list[RecordResult]
    decisions: dict[str, Decision] = field(default_factory=dict)

    def decide(
        self, call: CallRecords, bad: list[RecordResult], input_grads: bool
    ) -> list[Candidate]:
        """Decide ``call``, whose produced records ``bad`` fail, into :attr:`decisions`: its
        local candidate (a wrong parameter or buffer first, decided as made here)."""
        own = [p for p in call.params if p.status in _BAD]
        own += [b for b in call.consumed if b.role == "buffer" and b.status in _BAD]
        for p in own:
            floor = rounding_floor(p.metrics.dtype) if p.metrics else None
            self.decisions[p.key] = Decision(True, None, floor)
        if own:
            return [self.param_candidate(call, own[0])]
        if not bad:
            return []
        # gradients w.r.t. module inputs are recorded for the whole run or not at all; a
        # module whose inputs need no gradient (an embedding's ids) produces parameter
        # gradients only: without input or output gradients the consumed side is incomplete
        if call.phase == "backward" and not (input_grads and call.has_output_grads):
            candidate, decision = None, Decision(None, None, None)
        else:
            candidate, decision = self.classify(call, bad)
        self.decisions.update(dict.fromkeys((o.key for o in bad), decision))
        return [] if candidate is None else [candidate]

    def param_candidate(self, call: CallRecords, p: RecordResult) -> Candidate:
        """The candidate of a call whose own parameter or buffer ``p`` differs."""
        m = p.metrics
        expected = p.expected_error
        if p.role == "buffer":
            reason = (
                f"{call.module} ({call.module_type}) reads a buffer that differs from golden: "
                f"{_buffer_what(p, self.names)}; {_buffer_remedy(p, self.names)}"
            )
        elif m is not None and (m.nan_mismatch or m.inf_mismatch):
            # never a small error: the finite elements' norms say nothing next to NaN weights
            reason = (
                f"{call.module} ({call.module_type}): parameter {p.index} became non-finite by "
                f"step {p.step}: {m.nan_mismatch} NaN and {m.inf_mismatch} Inf where golden has "
                "none (or the reverse)"
            )
            if p.actual_dtype == "float16":  # AdamW's default eps rounds to 0 in float16
                reason += (
                    "; the parameters are stored in float16, where an optimizer's eps of 1e-8 "
                    "rounds to 0 and a zero second moment divides by zero: keep the optimizer "
                    "state and the master weights in float32 (mixed precision) or raise eps"
                )
        else:
            reason = (
                f"{call.module} ({call.module_type}) holds a parameter that differs from golden "
                f"(error {_fmt(_err(p))}{_scaled_by(m)}{stored_as(p)}): its weights, not its "
                "inputs, differ"
            )
        if p.role != "buffer" and expected is None and m is not None:
            # what the judge allowed it: a weight equal to golden's rounded to the tolerance
            # dtype would have passed (nothing at all for two copies in one dtype)
            expected = rounding_floor(m.dtype)
        cache = _cache_read(call, p, self.cache_names)
        return Candidate(
            result=p, local=True, reason=reason + _told(cache, False), expected_error=expected
        )

    def classify(
        self, call: CallRecords, bad: list[RecordResult]
    ) -> tuple[Candidate | None, Decision]:
        """Whether ``call``, whose produced records ``bad`` fail, made the error itself."""
        first, in_err, out_err, expected, amp = _amplified(call, bad)
        # what a forward call read besides its arguments and weights (a buffer, the KV cache),
        # where it differs: told in the why line, inside "its inputs match" when that is it
        buffer = cache = None
        if call.phase == "forward":
            buffer = _buffer_read(call, self.names)
            cache = _cache_read(call, first, self.cache_names)
        read = " ".join(x.inline for x in (cache, buffer) if x is not None)
        reason, inlined = _local_reason(
            call, first, in_err, out_err, expected, amp, self.profile, read
        )
        if reason is None:
            reason = _bias_reason(call, bad, self.profile)
        elif first.metrics is not None and first.metrics.level == "exact":
            amp, expected = None, None  # indices that differ have no float error to amplify
        if reason is None:
            return None, Decision(False, amp, expected)
        remedies: list[Advice] = []
        if call.phase == "forward":
            reason += (
                _told(buffer, inlined)
                + _glue_note(call, first, self.forward)
                + _told(cache, inlined)
                + cache_written(first, self.cache_names)
            )
            remedies = _advice(call, self.names)
        return Candidate(
            result=first,
            local=True,
            amplification=amp,
            input_error=in_err,
            reason=reason,
            expected_error=expected,
            remedies=remedies,
        ), Decision(True, amp, expected)


def _amplified(
    call: CallRecords, bad: list[RecordResult]
) -> tuple[RecordResult, float, float, float, float]:
    """The record ``call`` is judged by, and (input error, output error, expected error,
    their ratio): the largest the expected-error gate found, else the call's own."""
    # a router's failing top-k speaks for its call: its weights follow its choice (routing.py)
    first = next((r for r in bad if is_routing_finding(r)), bad[0])
    tol_dtype = first.metrics.dtype if first.metrics else "float32"
    in_err = max((_err(r) for r in call.consumed), default=0.0)
    out_err = max(_err(o) for o in call.produced)
    # the judge's K (calls.py): the forward call's inputs, parameters and buffers
    expected = expected_error(in_err, tol_dtype, call.k)
    amp = out_err / expected
    # the expected-error gate (judge.py) judged each record against everything it
    # consumed, concentrated error included: its ratio, where larger, is the measure
    gated = [o for o in bad if o.amplification is not None and o.expected_error is not None]
    worst = max(gated, key=lambda o: o.amplification or 0.0, default=None)
    if worst is not None and (worst.amplification or 0.0) > amp:
        first, amp, out_err = worst, worst.amplification or 0.0, _err(worst)
        expected = worst.expected_error or expected
    return first, in_err, out_err, expected, amp


def _collective_call(r: RecordResult) -> tuple[int, str] | None:
    """(step, call) of a collective's failing input record, else None."""
    if r.module.startswith("dist.") and r.role == "input" and r.status in _BAD:
        return r.step, r.key.rsplit(".", 2)[0]
    return None


def _fed_collective(c: Candidate) -> Candidate:
    """The candidate of a rank that fed a collective a wrong input, its why saying so."""
    if "rank" in c.reason:
        return c
    r = c.result
    note = f"; on rank {r.rank} it fed a collective a wrong input, which every rank then received"
    return c.model_copy(update={"reason": c.reason + note})


def decide_ranks(
    bad: Iterable[RecordResult], candidates: list[Candidate], firsts: list[Candidate]
) -> tuple[list[Candidate], list[Candidate]]:
    """The comparison's candidates and each rank's first, across ranks: a collective that
    looks local on one rank is dropped when another rank fed that call (step, key) a
    failing input (of ``bad``), and a rank whose first it was gets its next candidate."""
    wrong_inputs: dict[tuple[int, str], set[int]] = {}
    for r in bad:
        call = _collective_call(r)
        if call is not None:
            wrong_inputs.setdefault(call, set()).add(r.rank)
    if not wrong_inputs:
        return candidates, firsts

    def explained(c: Candidate) -> bool:
        r = c.result
        ranks = wrong_inputs.get((r.step, r.key.rsplit(".", 2)[0]), set())
        return r.module.startswith("dist.") and bool(ranks - {r.rank})

    kept = [c for c in candidates if not explained(c)]
    firsts_kept = [c for c in firsts if not explained(c)]
    if len(firsts_kept) < len(firsts):  # a rank's first was the collective: its next one
        by_rank = {c.result.rank for c in firsts_kept}
        for c in sorted(kept, key=lambda c: c.order):
            if c.result.rank not in by_rank:
                firsts_kept.append(c)
                by_rank.add(c.result.rank)
    return kept, firsts_kept


def _scaled_by(m: Metrics | None) -> str:
    """The why line's ", scaled by s ± se" clause: only where the scale bias is significant."""
    if isinstance(m, MeasuredMetrics) and m.bias and m.scale is not None and m.scale_se is not None:
        return f", scaled by {m.scale:.4g} ± {m.scale_se:.1g}"
    return ""


def _local_reason(
    call: CallRecords,
    first: RecordResult,
    in_err: float,
    out_err: float,
    expected: float,
    amp: float,
    profile: Profile,
    read: str,
) -> tuple[str | None, bool]:
    """Why ``call`` made error of its own, or None when it only passed error on; and
    whether ``read`` (what it read besides its arguments that differs, :class:`Read`)
    is told in it, as the cause when its inputs match."""
    if is_optimizer(first.phase, first.role):
        what, differs, ins = "the optimizer's update of its parameters", "does not", "gradients"
    elif call.phase == "forward":
        what, differs, ins = "its output", "does not", "inputs"
    else:
        what, differs, ins = "the gradients it computed", "do not", "incoming gradients and inputs"
    if first.status == "nonfinite" and not any(r.status == "nonfinite" for r in call.consumed):
        return (
            f"{call.module} ({call.module_type}) produced NaN/Inf where golden has none "
            f"(or the reverse) from {ins} without such a mismatch"
        ), False
    inputs_bad = any(r.status in _BAD for r in call.consumed)
    indices = index_reason(call.module, call.module_type, first, ins)
    if indices is not None and not inputs_bad:
        return indices, False
    dtype = first.metrics.dtype if first.metrics else "float32"
    if not inputs_bad and amp >= MIN_LOCAL_GROWTH:
        but = f"but {read} " if read else "but "
        return (
            f"{call.module} ({call.module_type}): its {ins} match (error {_fmt(in_err)}) {but}"
            f"{what} {differs}: error {_fmt(out_err)}{_scaled_by(first.metrics)}"
            f"{_concentration(first)} where {dtype} precision and "
            f"the {ins}' error explain {_fmt(expected)} ({_fmt(amp)}x)"
        ), bool(read)
    if amp >= profile.amplification:
        return (
            f"{call.module} ({call.module_type}) amplified the error of its {ins} "
            f"{_fmt(amp)}x ({_fmt(in_err)} -> {_fmt(out_err)}; {dtype} precision explains "
            f"{_fmt(expected)}), threshold {_fmt(profile.amplification)}x"
        ), False
    return None, False


def _buffer_name(b: RecordResult, names: dict[str, str]) -> str:
    return names.get(b.key) or f"buffer {b.index}"


def _buffer_what(b: RecordResult, names: dict[str, str]) -> str:
    return f"its buffer {_buffer_name(b, names)} differs (error {_fmt(_err(b))}{stored_as(b)})"


def _advice(call: CallRecords, names: dict[str, str]) -> list[Advice]:
    """A local forward call's candidate remedies (compare/advice.py), the buffers a cast
    rounded first."""
    cast = {
        _buffer_name(b, names): (b.golden_dtype, b.actual_dtype)
        for b in call.consumed
        if b.role == "buffer" and stored_as(b)
    }
    return candidates(call.module, call.module_type, cast)


def _buffer_remedy(b: RecordResult, names: dict[str, str]) -> str:
    name = _buffer_name(b, names)
    if stored_as(b):
        return (
            f"keep `{name}` in {b.golden_dtype} (model.to({b.actual_dtype}) casts float "
            f"buffers too: cast it back after the cast, or recompute it in {b.golden_dtype})"
        )
    return f"compute `{name}` as golden does (its values, not the module's arithmetic, differ)"


def _cache_read(call: CallRecords, first: RecordResult, names: dict[str, str]) -> Read | None:
    """The KV cache ``call`` read, where it differs from golden (caches.py), if any."""
    records = sorted([*call.consumed, *call.params, *call.produced], key=lambda r: r.seq)
    return cache_read(records, first, names)


def _buffer_read(call: CallRecords, names: dict[str, str]) -> Read | None:
    """The first buffer ``call`` read that is not bitwise golden's (``inv_freq``): another
    dtype, or any error."""
    for b in call.consumed:
        cast = b.actual_dtype is not None and b.actual_dtype != b.golden_dtype
        if b.role == "buffer" and (cast or _err(b) > 0):
            what = _buffer_what(b, names)
            # a cast buffer's remedy is one of the call's candidates (compare/advice.py),
            # not the line's only one: the angles may be computed in low precision too
            return Read(f"{what}, and", what, "" if cast else f"; {_buffer_remedy(b, names)}")
    return None


def _told(read: Read | None, inlined: bool) -> str:
    """``read``'s clause (unless the line told it inline) and its remedy."""
    if read is None:
        return ""
    return ("" if inlined else f"; {read.alone}") + read.remedy


def _concentration(r: RecordResult) -> str:
    """', concentrated in ...' when the worst slice or element is what failed the record."""
    m = r.metrics
    if m is None or m.level != "full":
        return ""
    parts = []
    limit = CONCENTRATION * m.error
    if m.slice_error is not None and m.slice_dim is not None and m.slice_error > limit:
        parts.append(
            f"worst slice {_fmt(m.slice_error)} at index {m.slice_index} of dim {m.slice_dim}"
        )
    if m.peak_error is not None and m.peak_error > limit:
        parts.append(f"max-abs {_fmt(m.peak_error)} of max|golden|")
    return f" ({', '.join(parts)})" if parts else ""


def _bias_reason(call: CallRecords, bad: list[RecordResult], profile: Profile) -> str | None:
    """Why ``call``'s produced records carry a systematic error of its own
    (expected.own_bias, with what the call read), or None."""
    inputs = [r.metrics for r in call.consumed if r.metrics is not None]
    scaled_in = [i for i in inputs if isinstance(i, MeasuredMetrics) and i.scale is not None]
    for o in bad:
        m = o.metrics
        if not isinstance(m, MeasuredMetrics) or m.scale is None:
            continue
        linear = linear_factors(
            call.module_type, o.phase, o.role, o.index, [*call.consumed, *call.params]
        )
        if linear is None and call.module_type in LINEAR_TYPES and len(scaled_in) == 1:
            # a module linear in its one float input: its own scale is s_out / s_in
            linear = scaled_in if scaled_in[0].scale else None
        excess = own_bias(
            m,
            profile,
            input_error=max((i.error for i in inputs), default=0.0),
            carried=carried_bias(inputs, profile),
            factors=linear,
            module_type=call.module_type,
        )
        if excess is not None:
            return _bias_text(call, o, m, scaled_in)
    return None


def _bias_text(
    call: CallRecords, o: RecordResult, m: MeasuredMetrics, scaled_in: list[MeasuredMetrics]
) -> str:
    """The why line of a systematic error of ``call``'s own, shown in its record ``o``."""
    assert m.scale is not None
    scaled = [i for i in scaled_in if i.scale is not None and math.isfinite(i.scale)]
    carried = max((abs(i.scale - 1.0) for i in scaled if i.scale is not None), default=0.0)
    what = "its output" if call.phase == "forward" else "a gradient it computed"
    if is_optimizer(o.phase, o.role):
        what = "the optimizer's update of its parameters"
    if call.module_type in LINEAR_TYPES and len(scaled) == 1 and scaled[0].scale:
        return (
            f"{call.module} ({call.module_type}) scales what it computes by "
            f"{m.scale / scaled[0].scale:.4g}: {what} is scaled by {m.scale:.4g} ± "
            f"{m.scale_se or 0.0:.1g} relative to golden, its input by "
            f"{scaled[0].scale:.4g}; a linear module passes its input's scale on "
            f"unchanged, so this is a systematic error of its own, not {m.dtype} rounding"
        )
    # the mean signed relative error: full tensors only (0 where statistics cannot say)
    mean_rel = (m.mean_rel_err if isinstance(m, FullMetrics) else None) or 0.0
    return (
        f"{call.module} ({call.module_type}): {what} is scaled by {m.scale:.4g} "
        f"± {m.scale_se or 0.0:.1g} relative to golden (mean relative error "
        f"{mean_rel:+.2g}) while its inputs' scale differs from 1 by at most "
        f"{_fmt(carried)}: a systematic error of its own, not {m.dtype} rounding"
    )


def _glue_note(call: CallRecords, first: RecordResult, forward: list[RecordResult]) -> str:
    """Say so when the error first shows in a submodule's input: code between submodules
    made it, in the innermost module that holds that submodule."""
    start = min((r.seq for r in call.consumed), default=-1)
    r = next((r for r in forward if start < r.seq < first.seq and r.status in _BAD), None)
    if r is None or r.role != "input" or not _contains(call.module, r.module):
        return ""
    owner = parent_module(r.module)
    if owner == call.module:
        return (
            f"; it first shows in the input of {r.module}, so {call.module}'s own code "
            "between its submodules made it"
        )
    return (
        f"; it first shows in the input of {r.module}, so the code of {owner} between "
        f"its submodules made it ({owner} is inside {call.module})"
    )


def _contains(outer: str, inner: str) -> bool:
    """True when module ``inner`` lies inside ``outer`` (keys write the root as ``root``,
    not as the empty prefix of every name)."""
    return outer == "root" or inner.startswith(outer + ".")


def _drop_explained(found: list[Candidate], keep: set[str]) -> list[Candidate]:
    """Drop calls that contain an earlier candidate of the same phase: the submodule
    explains them (a forward fault in a child does not explain its parent's backward).
    Candidates whose record key is in ``keep`` are never dropped."""
    kept: list[Candidate] = []
    for c in found:
        r = c.result
        explained = any(
            (k.result.step, k.result.rank, k.result.phase) == (r.step, r.rank, r.phase)
            and _contains(r.module, k.result.module)
            for k in kept
        )
        if r.key in keep or not explained:
            kept.append(c)
    return kept


def fallback(calls: StepCalls) -> Candidate | None:
    """The first failing record of a settled step when no module is local (or in backward)."""
    failing = list(calls.records.having(_BAD))
    for phase in ("forward", "backward"):
        r = next((r for r in failing if r.phase == phase), None)
        if r is None:
            continue
        at = f"{r.module} ({r.module_type})"
        if (
            phase == "forward"
            and r.role == "input"
            and (r.module == "root" or (r.metrics is not None and r.metrics.level == "exact"))
        ):
            reason = (
                f"the input of {at} already differs and no module made error of its own: "
                "the two runs were probably fed different data"
            )
        elif phase == "forward":
            reason = (
                "error grew gradually: no module made error of its own (none amplified its "
                f"input error >= the threshold); {at} is the first record outside tolerance"
            )
        elif is_optimizer(r.phase, r.role):
            reason = (
                f"first failing optimizer record, at {at}: the update (or state) its "
                "parameters took differs beyond what their gradients' error explains "
                "through the update rule"
            )
        elif not calls.input_grads:
            reason = (
                f"first failing gradient, at {at}; this recording has no gradients w.r.t. "
                "module inputs (backward.input records), so whether it made the error or "
                "passed it on is not decided"
            )
        else:
            reason = (
                f"first failing gradient, at {at}; no module's backward made error of its "
                "own that the recorded gradients can show"
            )
        return Candidate(result=r, local=False if phase == "forward" else None, reason=reason)
    return None


def rank_suspects(
    cands: list[Candidate], first: Candidate | None, top: int | None = None
) -> list[Suspect]:
    """Candidates other than ``first``, the most amplifying first, differing weights last."""
    rest = [c for c in cands if c is not first]
    rest.sort(key=lambda c: (c.amplification is None, -(c.amplification or 0.0), c.order))
    return [c.suspect() for c in rest[:top]]


def further_findings(cands: list[Candidate], first: Candidate | None) -> list[Suspect]:
    """Every call after a local ``first`` that made error of its own, in execution order
    (never capped: ``--suspects`` caps the ranked list only); empty when ``first`` is not
    local."""
    if first is None or first.local is not True:
        return []
    later = [c for c in cands if c is not first and c.local is not False]
    return [c.suspect() for c in sorted(later, key=lambda c: c.order)]


def decoding_divergence(units: list[UnitLike]) -> Candidate | None:
    """The first step whose root integer inputs (token ids) differ after steps that agreed:
    in a recording of ``generate()`` the steps after the two sides chose different tokens
    differ because their data differ (docs/compare.md, "Decoding divergence")."""
    agreed = False
    for unit in sorted(units, key=lambda u: (u.step, u.rank)):
        ids = [
            r
            for r in unit.results
            if r.module == "root"
            and r.phase == "forward"
            and r.role == "input"
            and r.call == 0
            and r.metrics is not None
            and (r.golden_dtype.startswith(("int", "uint")) or r.golden_dtype == "bool")
        ]
        if not ids:
            continue
        parted = [r for r in ids if _err(r) > 0 or r.status in _BAD]
        if not parted:
            agreed = True
            continue
        if not agreed:
            return None
        r = parted[0]
        return Candidate(
            result=r,
            local=False,
            reason=f"decoding divergence: the step inputs (token ids) part at step {r.step} "
            f"(the two sides chose different tokens at step {r.step - 1}), so the steps from "
            f"{r.step} on read other tokens and are not judged as layer errors; run "
            "`precguard generate-diff` to find whether the choice was a near-tie of the "
            "logits or a real divergence, and which layer made it",
        )
    return None
