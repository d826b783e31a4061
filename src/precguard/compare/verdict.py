"""The one pass: every rule of compare's verdict, in its phases, and one writer of status.

:func:`run_rules` takes one measured rank and step through the rules of
:data:`~precguard.compare.rules.RULES` in their four phases (compare/rule.py; the map and
"Where to add a rule" are in docs/architecture.md). In the settle phase each rule sets
what a record is allowed (a :class:`~precguard.compare.rule.Settlement`) and this pass
writes its status once (:meth:`_Walk.write`); then each module call is decided once
(:func:`~precguard.compare.divergence.decide_calls`) and the decisions are copied onto
the failing records. The step's records stay compact rows throughout (a step may hold
millions: docs/compare.md, "One big step"); each is read as a model where it is used.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from precguard.compare import rules as listed
from precguard.compare.calls import BAD, StepCalls
from precguard.compare.divergence import Candidate, Decision, decide_calls, fallback
from precguard.compare.judge import JudgeInputs
from precguard.compare.report import RecordResult, RecordRows
from precguard.compare.routing import Routing
from precguard.compare.rule import Explanations, Rule, Settlement, StepContext
from precguard.compare.tolerance import Profile


@dataclass
class StepVerdict:
    """One rank and step, judged and decided."""

    #: every record with its status, allowed error, expected error, amplification and
    #: (failing) local
    results: RecordRows
    #: module calls that introduced error, in execution order, explained ones dropped
    candidates: list[Candidate]
    #: the first failing record, when no call is local
    fallback: Candidate | None
    #: what each parameter and buffer carries into the next step; None when the
    #: expected-error judge did not run (a fixed profile)
    carried: dict[str, float] | None


class _Walk:
    """The settle phase over one step: each record in capture order (the module doc)."""

    def __init__(self, rules: list[Rule], records: RecordRows) -> None:
        self.rules = rules
        self.calls = StepCalls(records)

    def settle(self, r: RecordResult) -> None:
        """Every rule at one record, then its status written, then what the rules learn."""
        if r.metrics is None:  # missing: nothing to settle
            self.calls.add(r)
            return
        s = Settlement()
        for rule in self.rules:
            r = rule.settle(r, s, self)
        written = self.write(r, s)
        self.calls.add(written)
        for rule in self.rules:
            rule.written(written, self)

    @staticmethod
    def write(r: RecordResult, s: Settlement) -> RecordResult:
        """The one writer of a measured record's status and allowed error."""
        assert r.metrics is not None
        return r.model_copy(update={"status": s.verdict(r.metrics), "allowed_error": s.allowed})

    def rewrite(self, pos: int, r: RecordResult, s: Settlement) -> None:
        """Write the record at ``pos`` again from its settlement ``s`` (a later rule's
        verdict)."""
        self.calls.records[pos] = self.write(r, s)


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
    # each record settled takes its measured form's place in the step's rows (calls.py)
    walk = _Walk(rules, ctx.results)
    for r in ctx.results:
        walk.settle(r)
    why = why if why is not None else Explanations()
    for rule in rules:
        rule.explain(why)
    found, decisions = decide_calls(
        walk.calls, ctx.profile, why.buffer_names, why.settled, why.cache_names
    )
    _annotate(walk.calls.records, decisions)
    return StepVerdict(
        results=walk.calls.records,
        candidates=found,
        fallback=None if found else fallback(walk.calls),
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
    ctx = StepContext(results=RecordRows(results), profile=profile, inputs=judging, routes=routes)
    why = Explanations(buffer_names=buffer_names or {}, cache_names=cache_names or {})
    return run_rules(ctx, why)


def _annotate(records: RecordRows, decisions: dict[str, Decision]) -> None:
    """Copy the local/propagated decision onto the failing records it was made for."""
    for i in records.where(BAD):
        r = records[i]
        decision = decisions.get(r.key)
        if decision is not None:
            update: dict[str, Any] = {"local": decision.local}
            if r.expected_error is None:  # the expected-error gate's own figures stay
                update["amplification"] = decision.amplification
                update["expected_error"] = decision.expected_error
            records[i] = r.model_copy(update=update)
