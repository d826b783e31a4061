"""Mixture-of-experts routing as a rule of compare's one pass (compare/rules.py).

The rule's knowledge is in routing.py (:class:`~precguard.compare.routing.Routing`);
this module puts it in the phases of compare/rule.py: re-measure (the routers found,
their followers measured on the rows routed alike), adjust expected (a statistics-only
follower's expected error widened by what a re-routing may explain; the verdicts that
wait for no scores record), settle (a follower met before its router's verdict waits,
and is settled and written again once the router's scores record is written).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from precguard.compare.report import Metrics, RecordResult
from precguard.compare.routing import Routing
from precguard.compare.rule import BaseRule, Pass, Settlement, StepContext


class RoutingRule(BaseRule):
    """The routers of one step and the records that follow them (the module doc)."""

    def __init__(self, ctx: StepContext) -> None:
        self.routes: Routing | None = ctx.routes
        self.verdicts: dict[int, tuple[str, Metrics]] = {}  # by id of the router
        self.awaiting: dict[str, list[tuple[Any, Metrics]]] = defaultdict(list)  # scores key
        # followers met before the verdict: their positions and settlements, by router id
        self.pending: dict[int, list[tuple[int, Settlement]]] = defaultdict(list)

    @classmethod
    def for_step(cls, ctx: StepContext) -> RoutingRule:
        """The rule, with the routers given (``judge_unit``) or found at re-measuring."""
        return cls(ctx)

    def remeasure(self, ctx: StepContext) -> None:
        """Find the routers and measure their followers on the rows routed alike."""
        if self.routes is not None or ctx.stores is None or ctx.plan is None:
            return
        plan = ctx.plan
        self.routes = Routing.of_step(
            ctx.pairs, ctx.stores, plan.prof, plan.tolerance_dtype, plan.computes
        )
        ctx.results = self.routes.remeasure(ctx.results)

    def adjust(self, ctx: StepContext) -> None:
        """Widen a statistics-only follower's expected error by what re-routing explains;
        every router's verdict that waits for nothing, and the scores the others wait for
        (the step's records as re-measured)."""
        if self.routes is None:
            return
        if ctx.plan is not None and ctx.profile.rule == "expected":
            widened = self.routes.widened(ctx.results)
            ctx.inputs.calibrated = _wider(ctx.inputs.calibrated or {}, widened)
        for router, idx, scores in self.routes.awaited(ctx.results):
            if scores is None:  # nothing to wait for
                self.verdicts[id(router)] = self.routes.verdict(router, idx, None)
            else:
                self.awaiting[scores].append((router, idx))

    def settle(self, r: RecordResult, s: Settlement, step: Pass) -> RecordResult:
        """A follower with its router's verdict, or waiting for it."""
        if self.routes is None:
            return r
        follower = self.routes.followers.get(r.key)
        if follower is None:
            return r
        verdict = self.verdicts.get(id(follower.router))
        if verdict is not None:
            return self.routes.follow(r, verdict, s)
        self.pending[id(follower.router)].append((step.calls.settled, s))  # its position
        return r

    def written(self, r: RecordResult, step: Pass) -> None:
        """A router's scores written: its verdict, and the followers that came first."""
        if self.routes is None:
            return
        for router, idx in self.awaiting.pop(r.key, []):
            verdict = self.routes.verdict(router, idx, r)
            self.verdicts[id(router)] = verdict
            for pos, s in self.pending.pop(id(router), []):
                step.rewrite(pos, self.routes.follow(step.calls.records[pos], verdict, s), s)


def _wider(
    first: dict[str, tuple[float, float]], second: dict[str, tuple[float, float]]
) -> dict[str, tuple[float, float]]:
    """Per key, the larger of two measured widenings of the expected error."""
    out = dict(first)
    for key, (e, c) in second.items():
        old = out.get(key, (0.0, 0.0))
        out[key] = (max(old[0], e), max(old[1], c))
    return out
