"""The one pass: every rule of compare's verdict, in its phases, and one writer of status.

:func:`run_rules` takes one measured rank and step through the rules of
:data:`~precguard.compare.rules.RULES` in their four phases (compare/rule.py; the map and
"Where to add a rule" are in docs/architecture.md). In the settle phase each rule sets
what a record is allowed (a :class:`~precguard.compare.rule.Settlement`) and this pass
writes its status once (:meth:`_Walk.write`); then each module call is decided once
(:func:`~precguard.compare.divergence.decide_calls`) and the decisions are copied onto
the failing records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from precguard.compare import rules as listed
from precguard.compare.calls import StepCalls
from precguard.compare.divergence import Candidate, Decision, decide_calls, fallback
from precguard.compare.judge import JudgeInputs
from precguard.compare.report import RecordResult
from precguard.compare.routing import Routing
from precguard.compare.rule import Explanations, Rule, Settlement, StepContext
from precguard.compare.tolerance import Profile


@dataclass
class StepVerdict:
    """One rank and step, judged and decided."""

    #: every record with its status, allowed error, expected error, amplification and
    #: (failing) local
    results: list[RecordResult]
    #: module calls that introduced error, in execution order, explained ones dropped
    candidates: list[Candidate]
    #: the first failing record, when no call is local
    fallback: Candidate | None
    #: what each parameter and buffer carries into the next step; None when the
    #: expected-error judge did not run (a fixed profile)
    carried: dict[str, float] | None


class _Walk:
    """The settle phase over one step: each record in capture order (the module doc)."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        self.calls = StepCalls()
        self.settlements: list[Settlement | None] = []  # by position in ``calls``

    def settle(self, r: RecordResult) -> None:
        """Every rule at one record, then its status written, then what the rules learn."""
        if r.metrics is None:  # missing: nothing to settle
            self.calls.add(r)
            self.settlements.append(None)
            return
        s = Settlement()
        for rule in self.rules:
            r = rule.settle(r, s, self)
        self.calls.add(self.write(r, s))
        self.settlements.append(s)
        written = self.calls.records[-1]
        for rule in self.rules:
            rule.written(written, self)

    @staticmethod
    def write(r: RecordResult, s: Settlement) -> RecordResult:
        """The one writer of a measured record's status and allowed error."""
        assert r.metrics is not None
        return r.model_copy(update={"status": s.verdict(r.metrics), "allowed_error": s.allowed})

    def settlement(self, pos: int) -> Settlement:
        """The settlement of the record at ``pos`` (a measured one)."""
        s = self.settlements[pos]
        assert s is not None
        return s

    def rewrite(self, pos: int, r: RecordResult) -> None:
        """Write the record at ``pos`` again from its settlement (a later rule's verdict)."""
        self.calls.records[pos] = self.write(r, self.settlement(pos))


def run_rules(ctx: StepContext, why: Explanations | None = None) -> StepVerdict:
    """Run every rule of :data:`~precguard.compare.rules.RULES` over one measured step, in
    its phases (the module doc), and decide each module call."""
    # read at each step, so the list is the one place a rule is added (or a test adds one)
    rules: list[Rule] = [rule for make in listed.RULES if (rule := make(ctx)) is not None]
    for rule in rules:
        rule.remeasure(ctx)
    if ctx.inputs is None:
        ctx.inputs = JudgeInputs()
    for rule in rules:
        rule.adjust(ctx)
    walk = _Walk(rules)
    results = ctx.results
    for i, r in enumerate(results):
        walk.settle(r)
        # the settled form takes the measured one's place: one model per pair is held
        # through the pass, not two (a later reader of the step's list sees it settled)
        results[i] = walk.calls.records[i]
    why = why if why is not None else Explanations()
    for rule in rules:
        rule.explain(why)
    found, decisions = decide_calls(
        walk.calls, ctx.profile, why.buffer_names, why.settled, why.cache_names
    )
    results = _annotate(walk.calls.records, decisions)
    return StepVerdict(
        results=results,
        candidates=found,
        fallback=None if found else fallback(results),
        carried=why.carried,
    )


def judge_unit(
    results: list[RecordResult],
    profile: Profile,
    judging: JudgeInputs | None = None,
    routes: Routing | None = None,
    buffer_names: dict[str, str] | None = None,
    cache_names: dict[str, str] | None = None,
) -> StepVerdict:
    """Judge and decide one rank and step's measured records (:func:`run_rules`) without
    a comparison around them: ``judging``, what the expected-error judge knows besides the
    records; ``routes``, the step's routers (``Routing.of_step``);
    ``buffer_names`` and ``cache_names``, the names the why lines give records by key."""
    ctx = StepContext(results=list(results), profile=profile, inputs=judging, routes=routes)
    why = Explanations(buffer_names=buffer_names or {}, cache_names=cache_names or {})
    return run_rules(ctx, why)


def _annotate(results: list[RecordResult], decisions: dict[str, Decision]) -> list[RecordResult]:
    """Copy the local/propagated decision onto the failing records it was made for."""
    out = []
    for r in results:
        decision = decisions.get(r.key) if r.status in ("fail", "nonfinite") else None
        if decision is not None:
            update: dict[str, Any] = {"local": decision.local}
            if r.expected_error is None:  # the expected-error gate's own figures stay
                update["amplification"] = decision.amplification
                update["expected_error"] = decision.expected_error
            r = r.model_copy(update=update)
        out.append(r)
    return out
