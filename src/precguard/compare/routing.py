"""Mixture of experts: a router's top-k choice, and the records that follow its routing.

A router (Mixtral's ``MixtralTopKRouter``, Qwen2-MoE's, any module that returns
integer top-k indices beside the float scores they were ranked by) makes a
discrete choice: two correct runs whose scores differ by rounding send a token
whose k-th and (k+1)-th scores nearly tie to different experts, and that
token's row then differs by its whole size in everything the experts compute.
Judged as floats this reads as a fault (an error of 1 in the indices, 20x in
the experts). The rules here (docs/compare.md, "Mixture of experts"):

- **Integer records are indices**: compared element by element for equality
  (the share of differing elements), never by a relative float error; a
  re-routing whose explanation is settled here adds no error to what the
  judge carries (the records that follow it are compared on the rows routed
  alike instead).
- **A router's choice is judged from its scores**: a re-routed token crossed
  the golden score margin ``m`` between the expert it lost and the one it won
  (the k-th against the (k+1)-th score, or the two it swapped). Each score may
  differ by what the judge accepts for the scores record, ``amplification *
  expected_error * max|golden score|`` element by element, so rounding can
  cross a margin of twice that (:func:`margin_tolerance`). A re-routing within it is
  explained (reported as a count and the largest margin crossed); one beyond
  is a finding at the router. compare's one pass (compare/verdict.py) takes this
  verdict as soon as the scores record is judged, and settles every record that
  follows the router with it (those met before the scores, as the verdict comes).
- **A token's routing is the set of experts it reaches** (:func:`routed_alike`):
  the order of a top-k row is the kernel's (an unsorted top-k, two chosen experts
  swapped by a near-tie), so values per chosen expert (the routing weights wherever
  recorded, and their gradients) are paired by (token, expert), never by column.
  Identical routing is never a finding.
- **Records that follow the routing** (the module that consumed the indices,
  the experts, and everything inside its call; the router's own outputs in
  top-k order; in backward, each of these records' gradients as its forward twin,
  the router's own gradients and the gradient the block hands back) are compared,
  when both sides hold full tensors, on the rows
  both runs routed alike: tokens that reach the same experts, and for the rows of
  token-expert pairs inside the experts (``grouped_mm``'s expert-sorted rows,
  ``batched_mm``'s token-major rows, the eager loop's one call per expert) the
  pairs both runs formed. What such a record passes on to its consumers (the
  block around the experts) is its error over every row, re-routed ones
  included (``Metrics.error_all_rows``).
- Otherwise (statistics only) they are judged with the re-routing taken into
  account: a re-routed row differs by at most its norm on both sides (triangle
  inequality), so the expected error is widened by ``2 * ||golden rows that may
  re-route|| / ||golden||``: the tokens whose golden margin rounding can cross,
  when the golden recorded the router in full; every row otherwise (nothing
  then tells which tokens re-routed). Rows inside the experts that shift with
  the routing (sorted by expert, one call per expert) are widened by 2 too.
  Records whose shapes differ there (an expert's token count) pass when the
  router's choice is explained, counted as shape mismatches.

A router's own weights are also recomputed from its own logits and indices
(router_precision.py): when they are not what those give at the precision its code
asks for (a float32 island computed in bf16), that is a finding at the router.

Only routers whose scores rank their indices are judged by margins (the golden's
indices must be the top-k of one of its float outputs); another router (a
learned bias added before the top-k, group-limited routing: DeepSeek-V3) is
judged by expert identity the same way, and its re-routed tokens from its scores
record (the margins they crossed are not recorded).

The concepts live in their modules: routing_find.py (the routers and their
followers), routing_judge.py (a router's verdict from its scores, the widening),
routing_rows.py (followers re-measured on the rows routed alike); this module holds
the one-pass entry points the rules use.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from precguard.compare.levels import metrics_with
from precguard.compare.report import Metrics, RecordResult
from precguard.compare.router_precision import LOWERED
from precguard.compare.routing_find import Follower, Pair, Router, is_index_dtype
from precguard.compare.routing_judge import margin_tolerance
from precguard.compare.routing_rows import RowsRemeasure
from precguard.compare.rule import Settlement
from precguard.compare.tolerance import Profile
from precguard.dump.tensors import TensorStore


class Routing(RowsRemeasure):
    """The routers of one rank and step and the records that follow them."""

    @classmethod
    def of_step(
        cls,
        pairs: list[Pair],
        stores: tuple[TensorStore, TensorStore],
        profile: Profile,
        tol_mode: str = "auto",
        computes: tuple[str | None, str | None] = (None, None),
    ) -> Routing:
        """Find the routers among a step's aligned pairs and the records following each."""
        out = cls(stores, profile, tol_mode, computes)
        calls: dict[tuple[str, int], list[Pair]] = defaultdict(list)
        for g, a in pairs:
            if g.phase == "forward":
                calls[(g.module, g.call)].append((g, a))
        for (module, call), members in calls.items():
            router = out._router(module, call, members)
            if router is not None:
                out.routers.append(router)
                out._follow(router, calls, pairs)
        out.follow_backward(pairs)
        out.mark_decisions()
        return out

    # -- the routers' verdicts --------------------------------------------------

    def awaited(self, results: list[RecordResult]) -> list[tuple[Router, Metrics, str | None]]:
        """Every router whose indices were measured: (the router, its indices' metrics, the
        key of the scores record its verdict waits for, None when nothing is judged there).

        The one pass (compare/verdict.py) takes each router's verdict
        (:meth:`verdict`) as soon as its scores are judged, and settles every record
        that follows the router (:meth:`follow`) with it.
        """
        by_key = {r.key: r for r in results}
        out = []
        for router in self.routers:
            idx = by_key.get(router.index[0].key)
            if idx is None or idx.metrics is None:
                continue
            scores = by_key.get(router.scores[0].key) if router.scores is not None else None
            judged = scores.key if scores is not None and scores.metrics is not None else None
            out.append((router, idx.metrics, judged))
        return out

    def follower(self, key: str) -> Follower | None:
        """The routing the record ``key`` follows, if any."""
        return self.followers.get(key)

    def follow(self, r: RecordResult, verdict: tuple[str, Metrics], s: Settlement) -> RecordResult:
        """A record that follows a router (:meth:`follower`), settled with the router's
        verdict (in ``s``; compare/rule.py): the indices judged from the scores, a follower
        of a wrong routing failing at the router's finding, one whose shapes differ
        explained when the re-routing is."""
        f = self.followers[r.key]
        assert r.metrics is not None
        status, judged = verdict
        if f.kind == "index":
            # the index record's own level (exact, or statistics) with the router's verdict
            metrics = metrics_with(
                judged,
                {
                    k: v
                    for k, v in r.metrics.model_dump().items()
                    if k in ("level", "dtype", "error", "mismatched", "stat_rel_diff")
                },
            )
            s.explain_all()  # judged by the router's verdict, not by an error
            s.found = status == "fail"
            return r.model_copy(update={"metrics": metrics})
        own = any(f.pair is w for w in f.router.weights)
        if f.kind == "weights" and f.router.lowered is not None and own:
            # the router's own weights, not what its own logits give at the precision its
            # code asks for (compare/router_precision.py): a finding at the router
            s.found = True
            note = f.router.lowered
            return r.model_copy(update={"metrics": r.metrics.model_copy(update={"note": note})})
        if status == "fail":
            # it follows a routing that is itself wrong: the router is the finding
            if r.metrics.level == "none":
                s.found = True
            return r.model_copy(update={"amplification": None, "expected_error": None})
        if r.actual_shape is not None and r.metrics.level == "none":
            note = (
                f"shapes differ (golden {r.shape}, actual {r.actual_shape}): its rows follow "
                f"the routing of {f.router.module}, whose re-routing is explained; not compared"
            )
            rerouted = r.metrics.rerouted
            if rerouted is None:  # the ladder's re-routed rung (numerics.ladder)
                rerouted = f.router.rerouted()
            update = {"note": note, "rerouted": -1 if rerouted is None else rerouted}
            s.explain_all()
            return r.model_copy(update={"metrics": r.metrics.model_copy(update=update)})
        return r

    def keys(self) -> Iterable[str]:
        """Keys of every record that follows a routing (the routers' indices included)."""
        return self.followers.keys()


def is_routing_finding(r: RecordResult) -> bool:
    """Whether ``r`` is a router's top-k indices that fail: the router's choice itself is the
    finding, and the records of its call that follow the choice (the weights) follow it."""
    m = r.metrics
    return (
        r.status == "fail"
        and m is not None
        and m.level in ("exact", "stats")
        and m.rerouted is not None
        and bool(m.note)
        and is_index_dtype(r.golden_dtype)
    )


def index_reason(module: str, module_type: str, r: RecordResult, ins: str) -> str | None:
    """The reason a failing integer record names its module: indices that differ, counted as
    indices (a router's re-routing beyond near-ties, with its own note), or None."""
    m = r.metrics
    if m is not None and m.note and m.note.startswith(LOWERED):
        return f"{module} ({module_type}): its {ins} match but {m.note}"
    if m is None or m.level not in ("exact", "stats") or not is_index_dtype(r.golden_dtype):
        return None
    if m.rerouted is not None and m.note:
        return f"{module} ({module_type}): its {ins} match but its top-k choice does not: {m.note}"
    if m.level == "exact" and m.mismatched is not None:
        numel = math.prod(r.shape) if r.shape else 1
        return (
            f"{module} ({module_type}): its {ins} match but it produced different indices: "
            f"{m.mismatched} of {numel} elements differ ({m.mismatched / max(numel, 1):.3g})"
        )
    return None


__all__ = [
    "Pair",
    "Routing",
    "index_reason",
    "is_index_dtype",
    "is_routing_finding",
    "margin_tolerance",
]
