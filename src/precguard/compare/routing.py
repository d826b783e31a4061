"""Mixture of experts: a router's top-k choice, and the records that follow its routing.

A router (any module that returns integer top-k indices beside the float scores they
were ranked by) makes a discrete choice: two correct runs whose scores differ by
rounding may send a near-tie token to different experts. The rules are in
docs/compare.md, "Mixture of experts". Their concepts live in routing_find.py (the
routers and their followers: the weights, the module fed the indices and everything
inside its call, their gradients), routing_judge.py (a router's verdict from its
scores, :func:`margin_tolerance`, and the widening of statistics-only followers),
routing_rows.py (followers re-measured on the rows routed alike) and
router_precision.py (a router's weights recomputed from its own logits); this module
holds the one-pass entry points the rules use.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable

from precguard.compare.levels import metrics_with
from precguard.compare.report import Metrics, RecordResult
from precguard.compare.router_precision import LOWERED
from precguard.compare.routing_find import Pair, Router, is_index_dtype
from precguard.compare.routing_judge import by_keys
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

    def awaited(self, results: Iterable[RecordResult]) -> list[tuple[Router, Metrics, str | None]]:
        """Every router whose indices were measured: (the router, its indices' metrics, the
        key of the scores record its verdict (:meth:`verdict`) waits for, None when nothing
        is judged there)."""
        by_key = by_keys(results, self.verdict_keys(), measured=False)
        out = []
        for router in self.routers:
            idx = by_key.get(router.index[0].key)
            if idx is None or idx.metrics is None:
                continue
            scores = by_key.get(router.scores[0].key) if router.scores is not None else None
            judged = scores.key if scores is not None and scores.metrics is not None else None
            out.append((router, idx.metrics, judged))
        return out

    def follow(self, r: RecordResult, verdict: tuple[str, Metrics], s: Settlement) -> RecordResult:
        """A record that follows a router (in ``followers``), settled with the router's
        verdict (in ``s``; compare/rule.py): the indices judged from the scores, a follower
        of a wrong routing failing at the router's finding, one whose shapes differ
        explained when the re-routing is."""
        f = self.followers[r.key]
        assert r.metrics is not None
        status, judged = verdict
        if f.kind == "index":
            # the index record's own level (exact, or statistics) with the router's verdict
            own_level = {"level", "dtype", "error", "mismatched", "stat_rel_diff"}
            metrics = metrics_with(judged, r.metrics.model_dump(include=own_level))
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
