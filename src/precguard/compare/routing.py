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

Only routers whose scores rank their indices are judged by margins (the golden's
indices must be the top-k of one of its float outputs); another router (a
learned bias added before the top-k, group-limited routing: DeepSeek-V3) is
judged by expert identity the same way, and its re-routed tokens from its scores
record (the margins they crossed are not recorded).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from precguard.compare.expert_rows import (
    common_rows,
    crossed,
    gaps,
    pair_layouts,
    ranks,
    routed_alike,
    rows_of,
)
from precguard.compare.levels import MeasuredMetrics, concentrated, metrics_with
from precguard.compare.metrics import is_float_dtype, precision, tensor_metrics
from precguard.compare.report import Metrics, RecordResult
from precguard.compare.rule import Settlement
from precguard.compare.tolerance import Profile
from precguard.dump.schema import Record
from precguard.dump.tensors import TensorStore
from precguard.numerics import REROUTED_ROW_ERROR, SCORE_PAIR, rounding_floor, scale_excess

Pair = tuple[Record, Record]


def is_index_dtype(dtype: str) -> bool:
    """Integer dtypes: compared as indices, never by a relative float error."""
    return not is_float_dtype(dtype) and dtype not in ("bool", "complex64", "complex128")


def margin_tolerance(expected: float, amplification: float, absmax: float) -> float:
    """The golden score margin rounding can cross: both scores of the pair moving apart by
    the largest element error the judge accepts for the scores record."""
    return SCORE_PAIR * amplification * expected * absmax


@dataclass
class _Router:
    module: str
    call: int
    index: Pair
    #: the float output the golden's indices are the top-k of, if any
    scores: Pair | None = None
    #: float outputs in top-k order (the routing weights), same shape as the indices
    weights: list[Pair] = field(default_factory=list)
    g_idx: torch.Tensor | None = None
    a_idx: torch.Tensor | None = None
    g_scores: torch.Tensor | None = None
    a_scores: torch.Tensor | None = None
    #: per token: the same experts chosen, in any order (full tensors on both sides)
    same: torch.Tensor | None = None
    #: whether an output of the router ranks its indices (False: judged from its scores only)
    ranked: bool = True
    consumers: list[tuple[str, int]] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return math.prod(self.index[0].shape[:-1])

    @property
    def k(self) -> int:
        return self.index[0].shape[-1]

    def rerouted(self) -> int | None:
        return None if self.same is None else int((~self.same).sum())


@dataclass
class _Follower:
    """A record that follows a router's routing, and how its rows map to tokens."""

    router: _Router
    pair: Pair
    kind: str  # "weights", "index", "rows" (token rows), "pairs" (token-expert rows), "inner"
    passes_on_all: bool = False  # its error over every row feeds its consumers
    call_index: int = 0  # among the calls of its module inside the consumer's call


class Routing:
    """The routers of one rank and step and the records that follow them."""

    def __init__(
        self,
        stores: tuple[TensorStore, TensorStore],
        profile: Profile,
        tol_mode: str,
        computes: tuple[str | None, str | None],
    ) -> None:
        self.stores = stores
        self.profile = profile
        self.tol_mode = tol_mode
        self.computes = computes
        self.routers: list[_Router] = []
        self.followers: dict[str, _Follower] = {}

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
        return out

    # -- finding routers and their followers ----------------------------------------

    def _full(self, pair: Pair) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
        g, a = pair
        if g.tensor is None or a.tensor is None:
            return None, None
        return self.stores[0].tensor(g), self.stores[1].tensor(a)

    def _golden(self, rec: Record) -> torch.Tensor | None:
        return self.stores[0].tensor(rec) if rec.tensor is not None else None

    def _router(self, module: str, call: int, members: list[Pair]) -> _Router | None:
        outs = [p for p in members if p[0].role == "output"]
        index = next((p for p in outs if is_index_dtype(p[0].dtype) and len(p[0].shape) >= 2), None)
        if index is None or index[0].shape != index[1].shape:
            return None
        lead, k = list(index[0].shape[:-1]), index[0].shape[-1]
        floats = [
            p
            for p in outs
            if is_float_dtype(p[0].dtype) and list(p[0].shape[:-1]) == lead and p[0] is not index[0]
        ]
        candidates = [p for p in floats if p[0].shape[-1] > k]
        if not candidates:
            return None
        router = _Router(module, call, index)
        router.weights = [p for p in floats if p[0].shape[-1] == k and p[0].shape == p[1].shape]
        g_idx = self._golden(index[0])
        if g_idx is not None:
            g_idx = g_idx.reshape(-1, k).long()
            for p in candidates:
                scores = self._golden(p[0])
                if scores is not None and ranks(scores.reshape(g_idx.shape[0], -1), g_idx):
                    router.scores, router.g_scores = p, scores.reshape(g_idx.shape[0], -1).double()
                    break
            else:  # no output ranks the indices (a learned bias, group-limited top-k)
                router.scores, router.ranked = candidates[0], False
        else:
            router.scores = candidates[0]  # statistics only: the scores are judged as floats
        router.g_idx = g_idx
        a_idx = self._full(index)[1]
        if a_idx is not None and g_idx is not None:
            router.a_idx = a_idx.reshape(-1, k).long()
            router.same = routed_alike(router.g_idx, router.a_idx)
        if router.scores is not None and router.g_scores is not None:
            a_scores = self._full(router.scores)[1]
            if a_scores is not None:
                router.a_scores = a_scores.reshape(g_idx.shape[0], -1).double()  # type: ignore[union-attr]
        return router

    def _follow(
        self, router: _Router, calls: dict[tuple[str, int], list[Pair]], pairs: list[Pair]
    ) -> None:
        self.followers[router.index[0].key] = _Follower(router, router.index, "index")
        for p in router.weights:
            self.followers[p[0].key] = _Follower(router, p, "weights", passes_on_all=True)
        self._follow_weights(router, pairs)
        for (module, call), members in calls.items():
            if (module, call) == (router.module, router.call):
                continue
            fed = next(
                (p for p in members if p[0].role == "input" and self._same_tensor(p, router.index)),
                None,
            )
            if fed is None:
                continue
            router.consumers.append((module, call))
            self._follow_consumer(router, module, members, pairs)

    def _same_tensor(self, pair: Pair, index: Pair) -> bool:
        """Whether ``pair`` holds the router's indices on both sides (the experts' input)."""
        g, a = pair
        if g.shape != index[0].shape or g.dtype != index[0].dtype or a.shape != index[1].shape:
            return False
        for one, other, store in ((g, index[0], self.stores[0]), (a, index[1], self.stores[1])):
            if one.tensor is not None and other.tensor is not None:
                if not torch.equal(store.tensor(one), store.tensor(other)):
                    return False
            elif one.stats != other.stats:
                return False
        return True

    def _follow_consumer(
        self, router: _Router, module: str, members: list[Pair], pairs: list[Pair]
    ) -> None:
        tokens = router.tokens
        seqs = [p[0].seq for p in members]
        first, last = min(seqs), max(seqs)
        for p in members:
            g = p[0]
            if g.role == "param" or g.key in self.followers:
                continue
            if is_index_dtype(g.dtype) and g.shape == router.index[0].shape:
                self.followers[g.key] = _Follower(router, p, "index")
            elif is_float_dtype(g.dtype) and g.shape == router.index[0].shape:
                # one value per chosen expert, in the router's top-k order
                self.followers[g.key] = _Follower(router, p, "weights")
            elif is_float_dtype(g.dtype) and g.shape and rows_of(g.shape) == tokens:
                self.followers[g.key] = _Follower(
                    router, p, "rows", passes_on_all=g.role == "output"
                )
        inner_calls: dict[str, list[int]] = defaultdict(list)
        inner = [
            p
            for p in pairs
            if p[0].phase == "forward"
            and p[0].module.startswith(module + ".")
            and first < p[0].seq < last
            and p[0].role != "param"
            and is_float_dtype(p[0].dtype)
        ]
        for p in inner:
            if p[0].call not in inner_calls[p[0].module]:
                inner_calls[p[0].module].append(p[0].call)
        for p in inner:
            calls = sorted(inner_calls[p[0].module])
            self.followers.setdefault(
                p[0].key,
                _Follower(router, p, "pairs", call_index=calls.index(p[0].call)),
            )

    def _follow_weights(self, router: _Router, pairs: list[Pair]) -> None:
        """Records elsewhere that hold the router's weights on both sides (gpt-oss's block
        returns them beside its hidden states): values per chosen expert, in top-k order."""
        if not router.weights:
            return
        for p in pairs:
            g = p[0]
            if (
                g.phase != "forward"
                or g.role != "output"
                or g.key in self.followers
                or not is_float_dtype(g.dtype)
                or g.shape != router.index[0].shape
            ):
                continue
            if any(self._same_tensor(p, w) for w in router.weights):
                self.followers[g.key] = _Follower(router, p, "weights", passes_on_all=True)

    def follow_backward(self, pairs: list[Pair]) -> None:
        """Gradients follow the routing as the values they are gradients of: a backward
        record of a follower's call and role pairs its rows as its forward twin does; the
        router's own gradients (of its scores, of its input) differ on re-routed tokens by
        the gradient of what those tokens' experts computed."""
        twins = {
            (f.pair[0].module, f.pair[0].call, f.pair[0].role, f.pair[0].index): f
            for f in self.followers.values()
        }
        for p in pairs:
            g = p[0]
            if g.phase != "backward" or g.role not in ("input", "output"):
                continue
            if g.key in self.followers or not is_float_dtype(g.dtype):
                continue
            f = twins.get((g.module, g.call, g.role, g.index))
            if f is not None and f.kind != "index":
                self.followers[g.key] = _Follower(
                    f.router, p, f.kind, passes_on_all=f.kind != "pairs",
                    call_index=f.call_index,
                )  # fmt: skip
                continue
            for router in self.routers:
                if (g.module, g.call) != (router.module, router.call) or not g.shape:
                    continue
                if g.shape == router.index[0].shape:
                    self.followers[g.key] = _Follower(router, p, "weights", passes_on_all=True)
                elif rows_of(g.shape) == router.tokens:
                    self.followers[g.key] = _Follower(router, p, "rows", passes_on_all=True)
        self._follow_block_gradient(pairs)

    def _follow_block_gradient(self, pairs: list[Pair]) -> None:
        """The gradient a mixture-of-experts block hands back (its input's, the sum of what
        its router and its experts hand back) differs on re-routed tokens too, and so does
        the same tensor where the module before the block reads it (the norm's incoming
        gradient): both follow the routing as token rows."""
        blocks: dict[tuple[str, int], _Router] = {}
        for router in self.routers:
            parent = router.module.rpartition(".")[0]
            calls = [c for c in router.consumers if c[0].rpartition(".")[0] == parent]
            if parent and calls:
                blocks.setdefault((parent, router.call), router)
        handed: list[tuple[Pair, _Router]] = []
        for p in pairs:
            g = p[0]
            router = blocks.get((g.module, g.call))
            if (
                router is not None
                and g.phase == "backward"
                and g.role == "input"
                and is_float_dtype(g.dtype)
                and g.shape
                and rows_of(g.shape) == router.tokens
                and g.key not in self.followers
            ):
                self.followers[g.key] = _Follower(router, p, "rows", passes_on_all=True)
                handed.append((p, router))
        if not handed:
            return
        for p in pairs:
            g = p[0]
            if g.phase != "backward" or g.role != "output" or g.key in self.followers:
                continue
            for block, router in handed:
                if g.shape == block[0].shape and self._same_tensor(p, block):
                    self.followers[g.key] = _Follower(router, p, "rows", passes_on_all=True)
                    break

    # -- measuring on the rows routed alike ----------------------------------------

    def remeasure(self, results: list[RecordResult]) -> list[RecordResult]:
        """Results with the followers' metrics measured on the rows both runs routed alike
        (full tensors), and the routers' indices marked as judged here."""
        out = []
        by_key = {r.key: r for r in results if r.metrics is not None}
        for r in results:
            f = self.followers.get(r.key)
            if f is None or r.metrics is None or r.status == "missing":
                out.append(r)
                continue
            out.append(self._remeasured(r, r.metrics, f, by_key))
        return out

    def _remeasured(
        self, r: RecordResult, m: Metrics, f: _Follower, by_key: dict[str, RecordResult]
    ) -> RecordResult:
        router = f.router
        count = router.rerouted()
        if f.kind == "index":
            known = -1 if count is None else count
            return r.model_copy(update={"metrics": m.model_copy(update={"rerouted": known})})
        if router.same is None:
            update: dict[str, object] = {"rerouted": -1}
            if f.passes_on_all and m.level == "stats" and math.isfinite(m.error):
                # what it hands on may differ on the re-routed rows its sample missed: by
                # at most the widening the judge allows it (the triangle bound)
                whole = max(m.error, self._widening(f, by_key))
                update |= {"error_all_rows": whole, "conc_all_rows": whole}
            return r.model_copy(update={"metrics": m.model_copy(update=update)})
        rows = self._rows_for(f)
        if rows is None:
            return r
        g_rows, a_rows = rows
        if g_rows.numel() == 0:
            return r
        cols = self._expert_columns(f, a_rows) if f.kind == "weights" else None
        masked = self._metrics(f.pair, g_rows, a_rows, cols)
        note, compared = None, int(g_rows.numel())
        if f.passes_on_all and f.kind == "rows":
            expert, worst = self._worst_expert(f, masked)
            if worst is not None:
                masked, compared = worst, int(worst.routed_rows or 0)
                note = (
                    f"measured on the {compared} tokens both runs sent to expert {expert}, "
                    "the expert whose scale differs most"
                )
        update = {"rerouted": count, "routed_rows": compared}
        if note is not None:
            update["note"] = note
        if f.passes_on_all:
            whole = m.error if math.isfinite(m.error) else math.inf
            conc = max(x for x in (whole, *concentrated(m)) if x is not None)
            update |= {"error_all_rows": whole, "conc_all_rows": conc}
        if r.actual_shape is not None:
            update["note"] = (
                f"shapes differ (golden {r.shape}, actual {r.actual_shape}): compared on the "
                f"{g_rows.numel()} rows both runs routed alike"
            )
        return r.model_copy(update={"metrics": masked.model_copy(update=update)})

    def _worst_expert(self, f: _Follower, alike: Metrics) -> tuple[int, Metrics | None]:
        """The expert whose tokens (sent to it by both runs, routed alike) show the most
        significant scale, when more significant than over every token routed alike: a
        fault in one expert scales only the rows it serves, diluted over all of them."""
        router = f.router
        assert router.same is not None and router.g_idx is not None
        best: tuple[float, int, Metrics | None] = (_excess(alike, self.profile), -1, None)
        for e in sorted(set(router.g_idx.flatten().tolist())):
            rows = (router.same & router.g_idx.eq(e).any(dim=1)).nonzero().flatten()
            if rows.numel() < 2:
                continue
            m = self._metrics(f.pair, rows, rows)
            excess = _excess(m, self.profile)
            if excess > best[0]:
                best = (excess, e, m.model_copy(update={"routed_rows": int(rows.numel())}))
        return best[1], best[2]

    def _rows_for(self, f: _Follower) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(golden rows, actual rows) of the record to compare, in matching order."""
        router = f.router
        assert router.same is not None and router.g_idx is not None and router.a_idx is not None
        if f.kind in ("weights", "rows"):
            keep = router.same.nonzero().flatten()
            return keep, keep
        g, a = f.pair
        layouts = pair_layouts(router.g_idx, f.call_index, rows_of(g.shape))
        a_layouts = pair_layouts(router.a_idx, f.call_index, rows_of(a.shape))
        best: tuple[float, tuple[torch.Tensor, torch.Tensor]] | None = None
        grouped = self._grouped_rows(f)
        if grouped is not None and grouped[0].numel():
            best = (self._metrics(f.pair, *grouped).error, grouped)
        for name, g_keys in layouts.items():
            a_keys = a_layouts.get(name)
            if a_keys is None:
                continue
            rows = common_rows(g_keys, a_keys)
            if rows[0].numel() == 0:
                continue
            err = self._metrics(f.pair, *rows).error
            if best is None or err < best[0]:
                best = (err, rows)
        return None if best is None else best[1]

    def _grouped_rows(self, f: _Follower) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Rows sorted by expert (``grouped_mm``), each expert's rows in an order its sort
        does not fix: within each expert's group, the rows of the tokens both runs sent to
        it, paired by value (mutual nearest rows; one token's rows differ by rounding,
        two tokens' by their whole size)."""
        router = f.router
        assert router.g_idx is not None and router.a_idx is not None
        g, a = f.pair
        n = router.g_idx.numel()
        if rows_of(g.shape) != n or rows_of(a.shape) != n:
            return None
        gt, at = self._full(f.pair)
        assert gt is not None and at is not None
        gm, am = gt.reshape(n, -1).double(), at.reshape(n, -1).double()
        g_rows: list[torch.Tensor] = []
        a_rows: list[torch.Tensor] = []
        g_start = a_start = 0
        experts = sorted(
            set(router.g_idx.flatten().tolist()) | set(router.a_idx.flatten().tolist())
        )
        for e in experts:
            g_tok = set(torch.where(router.g_idx.eq(e))[0].tolist())
            a_tok = set(torch.where(router.a_idx.eq(e))[0].tolist())
            gs, as_ = range(g_start, g_start + len(g_tok)), range(a_start, a_start + len(a_tok))
            g_start, a_start = gs.stop, as_.stop
            common = len(g_tok & a_tok)
            if not common:
                continue
            gi, ai = torch.tensor(list(gs)), torch.tensor(list(as_))
            dist = torch.cdist(gm[gi], am[ai])
            to_a, to_g = dist.argmin(dim=1), dist.argmin(dim=0)
            mutual = [i for i in range(len(gi)) if int(to_g[to_a[i]]) == i]
            mutual.sort(key=lambda i: float(dist[i, to_a[i]]))
            for i in mutual[:common]:
                g_rows.append(gi[i])
                a_rows.append(ai[to_a[i]])
        if not g_rows:
            return None
        order = torch.stack(g_rows).argsort()
        return torch.stack(g_rows)[order], torch.stack(a_rows)[order]

    def _expert_columns(self, f: _Follower, rows: torch.Tensor) -> torch.Tensor:
        """Per token routed alike: the actual's column of each golden column's expert (a
        value per chosen expert is paired by the expert, not by its place in the top-k)."""
        router = f.router
        assert router.g_idx is not None and router.a_idx is not None
        g_idx, a_idx = router.g_idx.index_select(0, rows), router.a_idx.index_select(0, rows)
        cols = torch.empty_like(g_idx)
        return cols.scatter_(1, g_idx.argsort(dim=1), a_idx.argsort(dim=1))

    def _metrics(
        self,
        pair: Pair,
        g_rows: torch.Tensor,
        a_rows: torch.Tensor,
        a_cols: torch.Tensor | None = None,
    ) -> Metrics:
        g, a = pair
        gt, at = self._full(pair)
        assert gt is not None and at is not None
        g_prec = precision(g.dtype, g.compute_dtype or self.computes[0])
        a_prec = precision(a.dtype, a.compute_dtype or self.computes[1])
        width = gt.shape[-1] if gt.dim() > 1 else 1
        gm = gt.reshape(-1, width).index_select(0, g_rows)
        am = at.reshape(-1, width).index_select(0, a_rows)
        if a_cols is not None:
            am = am.gather(1, a_cols)
        return tensor_metrics(
            gm,
            am,
            golden_dtype=g_prec,
            actual_dtype=a_prec,
            profile=self.profile,
            tol_mode=self.tol_mode,
        )

    # -- statistics only: the widened expected error ------------------------------

    def widened(self, results: list[RecordResult]) -> dict[str, tuple[float, float]]:
        """Per key: the error a re-routing may explain in a follower compared on statistics
        only (merged into its expected error by the judge, as a calibration is)."""
        out: dict[str, tuple[float, float]] = {}
        by_key = {r.key: r for r in results if r.metrics is not None}
        for key, f in self.followers.items():
            r = by_key.get(key)
            if r is None or r.metrics is None or f.kind == "index":
                continue
            if r.metrics.level not in ("stats", "none"):
                continue
            w = self._widening(f, by_key)
            out[key] = (w, w)
        return out

    def _widening(self, f: _Follower, by_key: dict[str, RecordResult]) -> float:
        router = f.router
        g_t = self._golden(f.pair[0])
        if f.kind == "pairs" or router.g_scores is None or g_t is None:
            return REROUTED_ROW_ERROR  # rows shift with the routing / nothing says which moved
        scores = by_key.get(router.scores[0].key) if router.scores is not None else None
        tol = self._tolerance(router, scores)
        near = gaps(router.g_scores, router.k) <= tol
        rows = g_t.reshape(router.tokens, -1).double()
        total = float(rows.norm())
        if total == 0.0:
            return 0.0
        return REROUTED_ROW_ERROR * float(rows[near].norm()) / total

    def _tolerance(self, router: _Router, scores: RecordResult | None) -> float:
        assert router.g_scores is not None
        m = scores.metrics if scores is not None else None
        dtype = m.dtype if m is not None else "float32"
        k_in = None
        expected = scores.expected_error if scores is not None else None
        if expected is None:
            measured = m.error if m is not None and math.isfinite(m.error) else 0.0
            expected = max(measured, rounding_floor(dtype, k_in))
        absmax = float(router.g_scores.abs().max()) if router.g_scores.numel() else 0.0
        return margin_tolerance(expected, self.profile.amplification, absmax)

    # -- the routers' verdicts --------------------------------------------------

    def awaited(self, results: list[RecordResult]) -> list[tuple[_Router, Metrics, str | None]]:
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

    def follower(self, key: str) -> _Follower | None:
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

    def verdict(
        self, router: _Router, idx: Metrics, scores: RecordResult | None
    ) -> tuple[str, Metrics]:
        """The router's verdict, (status, its indices' metrics with the note): from its
        judged ``scores`` record, the margins the re-routed tokens crossed against what
        the scores' expected error lets rounding cross."""
        scores_ok = scores is None or scores.status == "pass"
        n = router.tokens
        if router.same is not None and bool(router.same.all()):
            # the same experts for every token: identical routing is never a finding (its
            # scores are judged as floats at their own record)
            note = f"every one of {n} tokens routed alike (the same experts)"
            return "pass", idx.model_copy(update={"note": note, "rerouted": 0})
        if router.same is not None and not router.ranked:
            moved_n = int((~router.same).sum())
            note = (
                f"{moved_n} of {n} tokens re-routed; no output of {router.module} ranks its "
                "indices (a learned bias or a group-limited top-k), so the margins they crossed "
                "are not measured: judged from its scores "
                + ("(they pass)" if scores_ok else "(they fail)")
            )
            return ("pass" if scores_ok else "fail"), idx.model_copy(
                update={"note": note, "rerouted": moved_n}
            )
        if router.same is None or router.g_scores is None:
            # statistics only (or no ranking scores): the choice follows from the scores
            note = (
                f"top-k indices of {router.module}: judged from its scores "
                + ("(they pass)" if scores_ok else "(they fail)")
                + "; which tokens re-routed needs full tensors of the router (--tensors "
                f"'{router.module}')"
            )
            ok = scores_ok and (router.scores is not None)
            beyond = self._beyond_near_ties(router, scores)
            if beyond is not None:
                ok, note = False, beyond
            return ("pass" if ok else "fail"), idx.model_copy(update={"note": note, "rerouted": -1})
        moved = (~router.same).nonzero().flatten()
        tol = self._tolerance(router, scores)
        worst, beyond = 0.0, 0
        assert router.g_idx is not None and router.a_idx is not None
        for t in moved.tolist():
            m = crossed(router.g_scores[t], router.g_idx[t], router.a_idx[t])
            worst = max(worst, m)
            # the actual's own scores are not a bound: a router that ranks scores rounded
            # to bf16 (Qwen2-MoE's probabilities) ties where its logits did not
            if m > tol:
                beyond += 1
        if beyond:
            note = (
                f"{moved.numel()} of {n} tokens re-routed, {beyond} of them across a score margin "
                f"(largest {worst:.3g}) beyond what the scores' expected error lets rounding "
                f"cross ({tol:.3g}): the top-k choice itself differs, not only its scores"
            )
        elif moved.numel():
            note = (
                f"{moved.numel()} of {n} tokens re-routed, each a near-tie: the largest score "
                f"margin crossed {worst:.3g} is within what the scores' expected error lets "
                f"rounding cross ({tol:.3g})"
            )
        else:
            note = f"every one of {n} tokens routed alike"
        status = "pass" if not beyond and scores_ok else "fail"
        update = {
            "note": note,
            "rerouted": int(moved.numel()),
            "reroute_margin": worst,
            "reroute_tolerance": tol,
        }
        return status, idx.model_copy(update=update)

    def _beyond_near_ties(self, router: _Router, scores: RecordResult | None) -> str | None:
        """With the golden's router in full and the actual's indices as statistics: why more
        indices differ than the near-tie tokens can account for, or None.

        Rounding can re-route only the tokens whose golden gap is within the tolerance, each
        changing at most k indices. The statistics bound the differing indices from below:
        each changes the zero count by at most 1, the sum by at most ``E - 1`` and the sum of
        squares by at most ``(E - 1)^2`` (indices lie in ``[0, E)``).
        """
        if router.g_scores is None or router.g_idx is None:
            return None
        gs, as_ = router.index[0].stats, router.index[1].stats
        if gs is None or as_ is None or not gs.numel:
            return None
        e_max = router.g_scores.shape[1] - 1
        if e_max < 1:
            return None
        bounds = []
        if gs.zeros is not None and as_.zeros is not None:
            bounds.append(abs(as_.zeros - gs.zeros))
        if gs.mean is not None and as_.mean is not None:
            bounds.append(abs(as_.mean - gs.mean) * gs.numel / e_max)
        if gs.l2 is not None and as_.l2 is not None:
            bounds.append(abs(as_.l2**2 - gs.l2**2) / e_max**2)
        differ = math.ceil(max(bounds, default=0.0) - 1e-6)
        tol = self._tolerance(router, scores)
        near = int((gaps(router.g_scores, router.k) <= tol).sum())
        if differ <= near * router.k:
            return None
        return (
            f"at least {differ} of {gs.numel} indices differ (from their statistics), more than "
            f"the {near} of {router.tokens} tokens whose golden score gap is within what the "
            f"scores' expected error lets rounding cross ({tol:.3g}) can account for: the top-k "
            "choice itself differs"
        )

    def keys(self) -> Iterable[str]:
        """Keys of every record that follows a routing (the routers' indices included)."""
        return self.followers.keys()


def _excess(m: Metrics, profile: Profile) -> float:
    """How far a scale lies beyond ``bias_z`` standard errors from 1 (-inf: not measured)."""
    if not isinstance(m, MeasuredMetrics):
        return -math.inf
    return scale_excess(m.scale, m.scale_se, profile.bias_z)


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
