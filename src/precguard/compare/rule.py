"""What a rule of compare's verdict is: its phases, and the one record of what it allows.

compare measures every aligned pair (compare/engine.py) and hands the step to the rules
(compare/rules.py lists them, in the order they run). A rule takes part in any of the
fixed phases of :class:`Rule` (re-measure, adjust expected, settle each record in
capture order, learn from it once written, explain) and leaves the others as
:class:`BaseRule`'s no-ops. It never writes a record's ``status``: the one pass
(compare/verdict.py) writes it once from the record's :class:`Settlement`
(:meth:`Settlement.verdict`, the one call of :func:`precguard.numerics.status`) and
stores the allowed error on the record. docs/architecture.md, "Where to add a rule",
walks through a new one.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from precguard.compare.calls import StepCalls
from precguard.compare.report import Metrics, RecordResult, RecordRows
from precguard.numerics import Verdict, status


@dataclass
class Settlement:
    """What one record is allowed, as the rules settle it (written once, by the pass).

    ``allowed``: the error the record is held to (None: no threshold applies); ``ratio``:
    where a rule holds more than ``Metrics.error`` to its limit (global and concentrated
    errors), that figure over its limit, failing above 1; ``found``: a rule found the
    error unexplained by something besides its size (a scale of its own, a router's choice).
    """

    allowed: float | None = None
    ratio: float | None = None
    found: bool = False

    def verdict(self, m: Metrics) -> Verdict:
        """The record's status: the one call of :func:`precguard.numerics.status`."""
        return status(m, self.allowed, ratio=self.ratio, found=self.found)

    def explain_all(self) -> None:
        """A rule explains the record whatever its error (a follower of an explained
        re-routing whose shapes differ): no threshold, no finding."""
        self.allowed, self.ratio, self.found = None, None, False


@dataclass
class StepContext:
    """One rank and step as the rules see it: what engine measured and what it knows;
    ``plan`` is the comparison's :class:`~precguard.compare.engine.ComparePlan`, with what
    it carries from step to step per rank (None: a step judged on its own, ``judge_unit``)."""

    #: every record, as compact rows (each read as a model when used)
    results: RecordRows
    profile: Any
    plan: Any = None
    rank: int = 0
    step: int = 0
    #: the aligned (golden, actual) record pairs and the two tensor stores
    pairs: list[tuple[Any, Any]] = field(default_factory=list)
    stores: tuple[Any, Any] | None = None
    g_recs: list[Any] = field(default_factory=list)
    a_recs: list[Any] = field(default_factory=list)
    #: what the expected-error judge knows besides the records (the adjust phase fills it)
    inputs: Any = None
    #: the routers of the step, when already found (judge_unit's ``routes``)
    routes: Any = None


@dataclass
class Explanations:
    """What the why lines name besides the records (the explain phase fills it)."""

    #: the recorded name of each buffer record, by key
    buffer_names: dict[str, str] = field(default_factory=dict)
    #: the recorded name of each KV-cache record, by key (caches.py)
    cache_names: dict[str, str] = field(default_factory=dict)
    #: records whose call a rule decided itself (loss.py), by key: divergence's
    #: ``Candidate`` (divergence.py imports the rules' modules, so not imported here)
    settled: dict[str, Any] = field(default_factory=dict)
    #: what each parameter and buffer carries into the next step (the expected-error
    #: judge's; None when it did not run)
    carried: dict[str, float] | None = None


class Pass(Protocol):
    """The one pass over a step as a rule sees it (compare/verdict.py)."""

    #: the step's records (the first ``calls.settled`` of them settled so far), grouped
    #: into module calls
    calls: StepCalls

    def rewrite(self, pos: int, r: RecordResult, s: Settlement) -> None:
        """Write the record at ``pos`` in ``calls`` again, from its (changed) settlement
        ``s`` (the rule that changes it keeps it: the pass keeps none)."""
        ...


class Rule(Protocol):
    """One rule of compare's verdict (the module doc), made for one step by its factory in
    compare/rules.py's list (:data:`RuleFactory`)."""

    def remeasure(self, ctx: StepContext) -> None:
        """Change what records are measured on (``ctx.results``: a router's followers on
        the rows both runs routed alike)."""

    def adjust(self, ctx: StepContext) -> None:
        """Add to what the expected-error judge knows (``ctx.inputs``: an optimizer's
        update rule, a calibration)."""

    def settle(self, r: RecordResult, s: Settlement, step: Pass) -> RecordResult:
        """At one measured record (capture order, after the rules before it): update ``s``
        and return the record with the figures the rule reports (never its status)."""
        ...

    def written(self, r: RecordResult, step: Pass) -> None:
        """After the record's status is written (it is in ``step.calls``): what the rule
        learns of it; an earlier record whose settlement that changes (a router's
        follower met before its verdict) is changed and written again (``step.rewrite``)."""
        ...

    def explain(self, why: Explanations) -> None:
        """Add to what the why lines name."""


#: how compare/rules.py lists a rule: made for a step, None when it has nothing to do there
#: (the expected-error judge under a fixed profile)
RuleFactory = Callable[[StepContext], Rule | None]


class BaseRule:
    """The phases a rule leaves alone: subclass and override the ones it takes part in."""

    def remeasure(self, ctx: StepContext) -> None:
        """Nothing re-measured."""

    def adjust(self, ctx: StepContext) -> None:
        """Nothing known besides the records."""

    def settle(self, r: RecordResult, s: Settlement, step: Pass) -> RecordResult:
        """The record as it is."""
        return r

    def written(self, r: RecordResult, step: Pass) -> None:
        """Nothing learned."""

    def explain(self, why: Explanations) -> None:
        """Nothing named."""
