"""The one judge: one pass over a step's records that sets status, local and reason together.

``compare`` judges each rank and step (compare/engine.py's ``compare_unit``) with
:func:`judge_unit`. It walks the step's records once, in capture order, and
settles each at its place:

1. **the expected-error judge** (judge.py, :class:`~precguard.compare.judge.StepJudge`):
   the record against the error what it consumed explains, an optimizer's update
   through its update rule (optimizer.py) among them; skipped under a fixed profile,
   whose statuses the tolerance set already;
2. **a router's top-k** (routing.py): the router's verdict is taken as soon as its
   scores are judged, and every record that follows the router (its indices, its
   weights, the experts' rows) is settled with it, at its place or, when it came
   before the scores, as soon as the verdict is known;
3. **a loss computed in low precision** (loss.py), at the loss record: it fails,
   local, with the rule's own why line;
4. the record joins its module call (calls.py), where the judge reads what later
   records consumed and their K.

When every record is settled, each module call is decided once (divergence.py,
:func:`~precguard.compare.divergence.decide_calls`): local or propagated from the
records it consumed and produced as the walk grouped them, with its why line; the
KV cache a forward candidate read is named there (caches.py). The decisions are
copied onto the failing records (``local``, and the figures where the judge set
none). Where a new rule goes: docs/architecture.md, "Where to add a rule".
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from precguard.compare.calls import StepCalls
from precguard.compare.divergence import Candidate, Decision, decide_calls, fallback
from precguard.compare.judge import JudgeInputs, StepJudge
from precguard.compare.loss import low_precision_loss
from precguard.compare.report import Metrics, RecordResult
from precguard.compare.routing import Routing
from precguard.compare.tolerance import Profile


@dataclass
class StepVerdict:
    """One rank and step, judged and decided."""

    #: every record with its status, expected error, amplification and (failing) local
    results: list[RecordResult]
    #: module calls that introduced error, in execution order, explained ones dropped
    candidates: list[Candidate]
    #: the first failing record, when no call is local
    fallback: Candidate | None
    #: what each parameter and buffer carries into the next step; None when the
    #: expected-error judge did not run (a fixed profile)
    carried: dict[str, float] | None


class _Walk:
    """The pass over one step: each record settled in capture order (the module doc)."""

    def __init__(
        self,
        results: list[RecordResult],
        profile: Profile,
        judging: JudgeInputs | None,
        routes: Routing | None,
    ) -> None:
        self.profile = profile
        self.calls = StepCalls()
        self.judge: StepJudge | None = None
        if profile.rule == "expected":
            self.judge = StepJudge(results, profile, self.calls, judging)
        self.routes = routes
        self.verdicts: dict[int, tuple[str, Metrics]] = {}  # by id of the router
        self.awaiting: dict[str, list[tuple[Any, Metrics]]] = defaultdict(list)  # scores key
        self.pending: dict[int, list[int]] = defaultdict(list)  # followers before the verdict
        self.settled: dict[str, Candidate] = {}  # records a rule decided (loss.py)
        if routes is not None:
            for router, idx, scores in routes.awaited(results):
                if scores is None:  # nothing to wait for
                    self.verdicts[id(router)] = routes.verdict(router, idx, None)
                else:
                    self.awaiting[scores].append((router, idx))

    def settle(self, r: RecordResult) -> None:
        """Judge one record, apply the rules at its place, and group it into its call."""
        if r.metrics is None:
            self.calls.add(r)
            return
        judged = self.judge.judge(r) if self.judge is not None else r
        follower = self.routes.follower(r.key) if self.routes is not None else None
        if follower is not None:
            verdict = self.verdicts.get(id(follower.router))
            if verdict is not None:
                judged = self._follow(judged, verdict)
            else:  # settled again when the router's scores are judged
                self.pending[id(follower.router)].append(len(self.calls.records))
        if r.phase == "forward":
            judged = self._loss(judged)
        self.calls.add(judged)
        for router, idx in self.awaiting.pop(r.key, []):
            self._router_verdict(router, idx, judged)

    def _follow(self, r: RecordResult, verdict: tuple[str, Metrics]) -> RecordResult:
        assert self.routes is not None
        return self.routes.follow(r, verdict)

    def _router_verdict(self, router: Any, idx: Metrics, scores: RecordResult) -> None:
        """A router's scores are judged: its verdict, and the followers that came first."""
        assert self.routes is not None
        verdict = self.routes.verdict(router, idx, scores)
        self.verdicts[id(router)] = verdict
        for pos in self.pending.pop(id(router), []):
            self.calls.replace(pos, self._follow(self.calls.records[pos], verdict))

    def _loss(self, r: RecordResult) -> RecordResult:
        """The loss rule (loss.py) at a forward record: the finding replaces the call's
        decision on it."""
        found = low_precision_loss(r, self.calls)
        if found is None:
            return r
        r, candidate = found
        self.settled[r.key] = candidate
        return r

    def finish(self, buffer_names: dict[str, str], cache_names: dict[str, str]) -> StepVerdict:
        """Decide every call and copy the decisions onto the failing records."""
        classified = decide_calls(self.calls, self.profile, buffer_names, self.settled, cache_names)
        found = classified.candidates
        results = _annotate(self.calls.records, classified.decisions)
        return StepVerdict(
            results=results,
            candidates=found,
            fallback=None if found else fallback(results),
            carried=self.judge.carried_on() if self.judge is not None else None,
        )


def judge_unit(
    results: list[RecordResult],
    profile: Profile,
    judging: JudgeInputs | None = None,
    routes: Routing | None = None,
    buffer_names: dict[str, str] | None = None,
    cache_names: dict[str, str] | None = None,
) -> StepVerdict:
    """Judge and decide one rank and step's measured records in one pass (the module doc).

    Under the ``expected`` rule (the default profile) each record is judged by the
    expected-error judge, with ``judging`` (nothing known of earlier steps when None);
    under a fixed profile the statuses the tolerance set stand. ``routes``: the step's routers
    (:meth:`precguard.compare.routing.Routing.of_step`, its followers re-measured).
    ``buffer_names`` and ``cache_names``: the recorded names of the buffer and KV-cache
    records by key, which the why lines name.
    """
    walk = _Walk(results, profile, judging, routes)
    for r in results:
        walk.settle(r)
    return walk.finish(buffer_names or {}, cache_names or {})


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
