"""Finding the routers of one rank and step, and the records that follow each: a router
is a module call that returns integer top-k indices beside a float output wider than k
(its scores); its followers are listed in routing.py's docstring.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from precguard.compare.expert_rows import gaps, ranks, routed_alike, rows_of
from precguard.compare.metrics import is_float_dtype, precision, tolerance_dtype
from precguard.compare.router_precision import lowered_weights
from precguard.compare.tolerance import Profile
from precguard.dump.schema import Record
from precguard.dump.tensors import TensorStore
from precguard.numerics import SCORE_PAIR, relative_l2_rows, rounding_floor

if TYPE_CHECKING:
    import torch

Pair = tuple[Record, Record]


def margin_tolerance(expected: float, amplification: float, absmax: float) -> float:
    """The golden score margin rounding can cross: both scores of the pair moving apart by
    the largest element error the judge accepts for the scores record."""
    return SCORE_PAIR * amplification * expected * absmax


def _token_inputs(members: list[Pair], tokens: int) -> list[Pair]:
    """A call's float inputs with one row per token, the same shape on both sides."""
    return [
        p
        for p in members
        if p[0].role == "input"
        and is_float_dtype(p[0].dtype)
        and p[0].shape == p[1].shape
        and rows_of(p[0].shape) == tokens
    ]


def is_index_dtype(dtype: str) -> bool:
    """Integer dtypes: compared as indices, never by a relative float error."""
    return not is_float_dtype(dtype) and dtype not in ("bool", "complex64", "complex128")


@dataclass
class Router:
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
    #: per token: routed alike, the same experts chosen in any order and their weights
    #: within rounding (full tensors on both sides)
    same: torch.Tensor | None = None
    #: per token: the same experts chosen, but a decision inside the router flipped at a
    #: near-tie (its own weights or gradients jump: ``RouterFinder.mark_decisions``); these
    #: tokens are not in ``same``
    jumped: torch.Tensor | None = None
    #: whether an output of the router ranks its indices (False: judged from its scores only)
    ranked: bool = True
    #: why the actual computed its weights below the precision its code asks for
    #: (compare/router_precision.py), None when it did not or this cannot be told
    lowered: str | None = None
    consumers: list[tuple[str, int]] = field(default_factory=list)
    #: its float inputs with one row per token (the hidden states it routes)
    inputs: list[Pair] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return math.prod(self.index[0].shape[:-1])

    @property
    def k(self) -> int:
        return self.index[0].shape[-1]

    def rerouted(self) -> int | None:
        return None if self.same is None else int((~self.same).sum())


@dataclass
class Follower:
    """A record that follows a router's routing, and how its rows map to tokens."""

    router: Router
    pair: Pair
    kind: str  # "weights", "index", "rows" (token rows), "pairs" (token-expert rows)
    passes_on_all: bool = False  # its error over every row feeds its consumers
    call_index: int = 0  # among the calls of its module inside the consumer's call


@dataclass(eq=False)
class RouterFinder:
    """The routers of one rank and step and the records that follow them (found from
    the aligned pairs: routing.py's ``Routing.of_step``)."""

    stores: tuple[TensorStore, TensorStore]
    profile: Profile
    tol_mode: str
    computes: tuple[str | None, str | None]
    routers: list[Router] = field(default_factory=list)
    followers: dict[str, Follower] = field(default_factory=dict)

    def _full(self, pair: Pair) -> tuple[torch.Tensor, torch.Tensor] | tuple[None, None]:
        g, a = pair
        if g.tensor is None or a.tensor is None:
            return None, None
        return self.stores[0].tensor(g), self.stores[1].tensor(a)

    def _golden(self, rec: Record) -> torch.Tensor | None:
        return self.stores[0].tensor(rec) if rec.tensor is not None else None

    def _router(self, module: str, call: int, members: list[Pair]) -> Router | None:
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
        router = Router(module, call, index)
        router.weights = [p for p in floats if p[0].shape[-1] == k and p[0].shape == p[1].shape]
        router.inputs = _token_inputs(members, router.tokens)
        self._rank_scores(router, candidates)
        self._actual_choice(router)
        router.lowered = self._lowered(router, candidates, members)
        return router

    def _lowered(self, router: Router, candidates: list[Pair], members: list[Pair]) -> str | None:
        """Why the actual computed its routing weights below the precision asked (full
        tensors of logits, indices and weights on both sides; compare/router_precision.py)."""
        if router.g_idx is None or router.a_idx is None or not router.weights:
            return None
        weights = router.weights[0]
        g_w, a_w = self._full(weights)
        if g_w is None or a_w is None:
            return None
        asked = (self._asked(weights[0], members, 0), self._asked(weights[1], members, 1))
        tokens = router.tokens
        for p in candidates:
            g_lg, a_lg = self._full(p)
            if g_lg is None or a_lg is None or p[0].shape != p[1].shape:
                continue
            why = lowered_weights(
                (g_lg.reshape(tokens, -1), router.g_idx, g_w.reshape(tokens, -1)),
                (a_lg.reshape(tokens, -1), router.a_idx, a_w.reshape(tokens, -1)),
                asked,
                router.same,
            )
            if why is not None:
                return why or None
        return None

    def _asked(self, rec: Record, members: list[Pair], side: int) -> str:
        """The precision a router's output was asked for on ``side``: its stored dtype when
        the run's dtypes are the code's (no compute precision declared, or the router's
        inputs stored in it), else the less precise of it and the declared compute one."""
        compute = rec.compute_dtype or self.computes[side]
        if compute is None:
            return rec.dtype
        code_dtypes = any(p[side].role == "input" and p[side].dtype == compute for p in members)
        return rec.dtype if code_dtypes else precision(rec.dtype, compute)

    def _rank_scores(self, router: Router, candidates: list[Pair]) -> None:
        """The router's scores: the float output its golden indices are the top-k of, or
        (none ranks them, or the golden's indices are statistics) the first candidate."""
        g_idx = self._golden(router.index[0])
        if g_idx is None:
            router.scores = candidates[0]  # statistics only: the scores are judged as floats
            return
        g_idx = g_idx.reshape(-1, router.k).long()
        router.g_idx = g_idx
        for p in candidates:
            scores = self._golden(p[0])
            if scores is not None and ranks(scores.reshape(g_idx.shape[0], -1), g_idx):
                router.scores, router.g_scores = p, scores.reshape(g_idx.shape[0], -1).double()
                return
        # no output ranks the indices (a learned bias, group-limited top-k)
        router.scores, router.ranked = candidates[0], False

    def _actual_choice(self, router: Router) -> None:
        """The actual's indices in full, and which tokens both runs routed alike."""
        if router.g_idx is None:
            return
        a_idx = self._full(router.index)[1]
        if a_idx is not None:
            router.a_idx = a_idx.reshape(-1, router.k).long()
            router.same = routed_alike(router.g_idx, router.a_idx)

    def mark_decisions(self) -> None:
        """Take out of each router's tokens routed alike those that kept their experts
        while a decision inside the router flipped (``Router.jumped``; docs/compare.md,
        "Mixture of experts"): a row of the router's own weights or gradients that jumps
        (:meth:`_jumps`) at a near-tie of the token's golden scores (:meth:`near_ties`).
        A row that jumps away from any near-tie stays, judged where it is recorded."""
        import torch

        for router in self.routers:
            if router.same is None:
                continue
            own = [
                f.pair
                for f in self.followers.values()
                if f.router is router
                and f.kind in ("weights", "rows")
                and (f.pair[0].module, f.pair[0].call) == (router.module, router.call)
            ]
            given = self._input_error(router) if own else None
            if given is None:
                continue  # no own record to judge, or what it was given is not held in full
            jumped = torch.zeros_like(router.same)
            for pair in own:
                jumped |= self._jumps(router, pair, given)
            jumped &= router.same
            if bool(jumped.any()):
                jumped &= self.near_ties(router)
            if bool(jumped.any()):
                router.jumped = jumped
                router.same = router.same & ~jumped

    def _input_error(self, router: Router) -> torch.Tensor | None:
        """Per token: the relative error of what the router was given (the largest over its
        inputs with a row per token), None when no input is held in full."""
        import torch

        errors = []
        for pair in router.inputs:
            g_t, a_t = self._full(pair)
            if g_t is None or a_t is None:
                continue
            g_t = g_t.reshape(router.tokens, -1).double()
            a_t = a_t.reshape(router.tokens, -1).double()
            errors.append(relative_l2_rows((g_t - a_t).norm(dim=1), g_t.norm(dim=1)))
        return torch.stack(errors).amax(dim=0) if errors else None

    def _jumps(self, router: Router, pair: Pair, given: torch.Tensor) -> torch.Tensor:
        """Per token: whether its row of ``pair`` differs by more than the judge accepts for
        one element given that token's input error ``given`` (``amplification`` times the
        rounding floor plus it, relative to the record's largest element; values per chosen
        expert paired by expert). A token whose input already differs (re-routed upstream)
        moves its router's outputs by its input's error, not by a decision."""
        import torch

        none = torch.zeros(router.tokens, dtype=torch.bool)
        g_t, a_t = self._full(pair)
        if g_t is None or a_t is None or pair[0].shape != pair[1].shape:
            return none
        g_t = g_t.reshape(router.tokens, -1).double()
        a_t = a_t.reshape(router.tokens, -1).double()
        if list(pair[0].shape) == list(router.index[0].shape):
            assert router.g_idx is not None and router.a_idx is not None
            g_t = g_t.gather(1, router.g_idx.argsort(dim=1))
            a_t = a_t.gather(1, router.a_idx.argsort(dim=1))
        absmax = float(g_t.abs().max()) if g_t.numel() else 0.0
        floor = rounding_floor(self._judged_in(pair))
        bound = self.profile.amplification * (floor + given) * absmax
        return (g_t - a_t).abs().amax(dim=1) > bound

    def near_ties(self, router: Router) -> torch.Tensor:
        """Per token: whether two of its golden scores among the top k + 1 lie within the
        margin rounding of the scores alone can cross (:func:`margin_tolerance` at their
        rounding floor; the router's verdict allows at least that)."""
        import torch

        scores = router.g_scores
        if scores is None and router.scores is not None:
            golden = self._golden(router.scores[0])
            scores = None if golden is None else golden.reshape(router.tokens, -1).double()
        if scores is None or router.scores is None:
            return torch.zeros(router.tokens, dtype=torch.bool)
        absmax = float(scores.abs().max()) if scores.numel() else 0.0
        floor = rounding_floor(self._judged_in(router.scores))
        return gaps(scores, router.k) <= margin_tolerance(floor, self.profile.amplification, absmax)

    def _judged_in(self, pair: Pair) -> str:
        """The dtype whose tolerance judges ``pair``: each side's compute precision, as
        compare's measure takes it (metrics.tolerance_dtype)."""
        g, a = pair
        return tolerance_dtype(
            precision(g.dtype, g.compute_dtype or self.computes[0]),
            precision(a.dtype, a.compute_dtype or self.computes[1]),
            self.tol_mode,
        )

    def _follow(
        self, router: Router, calls: dict[tuple[str, int], list[Pair]], pairs: list[Pair]
    ) -> None:
        self.followers[router.index[0].key] = Follower(router, router.index, "index")
        for p in router.weights:
            self.followers[p[0].key] = Follower(router, p, "weights", passes_on_all=True)
        # records elsewhere that hold the router's weights (gpt-oss's block returns them
        # beside its hidden states): values per chosen expert, in top-k order
        self._follow_copies(pairs, "forward", [(w, router, "weights") for w in router.weights])
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
        import torch

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
        self, router: Router, module: str, members: list[Pair], pairs: list[Pair]
    ) -> None:
        for p in members:
            follower = _consumer_record(router, p)
            if follower is not None:
                self.followers.setdefault(p[0].key, follower)
        seqs = [p[0].seq for p in members]
        self._follow_inner(router, module, (min(seqs), max(seqs)), pairs)

    def _follow_inner(
        self, router: Router, module: str, span: tuple[int, int], pairs: list[Pair]
    ) -> None:
        """The float records inside the consumer's call (captured between its first and
        last record): rows of token-expert pairs, numbered by their module's call."""
        first, last = span
        inner_calls: dict[str, set[int]] = defaultdict(set)
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
            inner_calls[p[0].module].add(p[0].call)
        for p in inner:
            index = sorted(inner_calls[p[0].module]).index(p[0].call)
            self.followers.setdefault(p[0].key, Follower(router, p, "pairs", call_index=index))

    def _follow_copies(
        self, pairs: list[Pair], phase: str, sources: list[tuple[Pair, Router, str]]
    ) -> None:
        """Float outputs of ``phase`` elsewhere that hold a source's tensor on both sides
        follow its router as ``kind`` (the first source that matches)."""
        if not sources:
            return
        for p in pairs:
            g = p[0]
            if g.phase != phase or g.role != "output" or g.key in self.followers:
                continue
            for source, router, kind in sources:
                if self._same_tensor(p, source):
                    self.followers[g.key] = Follower(router, p, kind, passes_on_all=True)
                    break

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
                self.followers[g.key] = Follower(
                    f.router, p, f.kind, passes_on_all=f.kind != "pairs",
                    call_index=f.call_index,
                )  # fmt: skip
                continue
            for router in self.routers:
                if (g.module, g.call) != (router.module, router.call) or not g.shape:
                    continue
                if g.shape == router.index[0].shape:
                    self.followers[g.key] = Follower(router, p, "weights", passes_on_all=True)
                elif rows_of(g.shape) == router.tokens:
                    self.followers[g.key] = Follower(router, p, "rows", passes_on_all=True)
        self._follow_block_gradient(pairs)

    def _follow_block_gradient(self, pairs: list[Pair]) -> None:
        """The gradient a mixture-of-experts block hands back (its input's) differs on
        re-routed tokens too, and so does the same tensor where the module before the block
        reads it: both follow the routing as token rows."""
        blocks = self._blocks()
        handed: list[tuple[Pair, Router]] = []
        for p in pairs:
            g = p[0]
            router = blocks.get((g.module, g.call))
            if router is None or g.key in self.followers or g.phase != "backward":
                continue
            # a float gradient of the block's input, one row per token
            rows = rows_of(g.shape) if g.shape else -1
            if g.role == "input" and is_float_dtype(g.dtype) and rows == router.tokens:
                self.followers[g.key] = Follower(router, p, "rows", passes_on_all=True)
                handed.append((p, router))
        # the same gradient where the module before the block reads it
        self._follow_copies(pairs, "backward", [(p, router, "rows") for p, router in handed])

    def _blocks(self) -> dict[tuple[str, int], Router]:
        """Per (block, call): the router whose consumer is its sibling in that block."""
        blocks: dict[tuple[str, int], Router] = {}
        for router in self.routers:
            parent = router.module.rpartition(".")[0]
            calls = [c for c in router.consumers if c[0].rpartition(".")[0] == parent]
            if parent and calls:
                blocks.setdefault((parent, router.call), router)
        return blocks


def _consumer_record(router: Router, p: Pair) -> Follower | None:
    """How a record of the call that consumed the indices follows the routing, if it does:
    indices, one value per chosen expert (the router's top-k order), or token rows."""
    g = p[0]
    if g.role == "param":
        return None
    if is_index_dtype(g.dtype) and g.shape == router.index[0].shape:
        return Follower(router, p, "index")
    if is_float_dtype(g.dtype) and g.shape == router.index[0].shape:
        return Follower(router, p, "weights")
    if is_float_dtype(g.dtype) and g.shape and rows_of(g.shape) == router.tokens:
        return Follower(router, p, "rows", passes_on_all=g.role == "output")
    return None
