"""A router's top-k choice judged from its scores (a re-routed token crossed a golden
score margin; rounding can cross twice what the judge accepts for each score:
:func:`margin_tolerance`), and the widening a re-routing explains in the followers
compared on statistics only.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from precguard.compare.expert_rows import crossed, gaps
from precguard.compare.report import Metrics, RecordResult
from precguard.compare.routing_find import Follower, Router, RouterFinder, margin_tolerance
from precguard.numerics import REROUTED_ROW_ERROR, rounding_floor


class RouterJudge(RouterFinder):
    """The routers' verdicts from their scores, and the widened expected error of the
    followers compared on statistics only."""

    def verdict_keys(self) -> set[str]:
        """The keys of the records the routers' verdicts read: each one's indices and scores."""
        return {
            pair[0].key
            for router in self.routers
            for pair in (router.index, router.scores)
            if pair is not None
        }

    def widened(self, results: Iterable[RecordResult]) -> dict[str, tuple[float, float]]:
        """Per key: the error a re-routing may explain in a follower compared on statistics
        only (merged into its expected error by the judge, as a calibration is)."""
        out: dict[str, tuple[float, float]] = {}
        by_key = by_keys(results, self.verdict_keys() | self.followers.keys())
        for key, f in self.followers.items():
            r = by_key.get(key)
            m = r.metrics if r is not None else None
            if m is not None and f.kind != "index" and m.level in ("stats", "none"):
                w = self._widening(f, by_key)
                out[key] = (w, w)
        return out

    def _widening(self, f: Follower, by_key: dict[str, RecordResult]) -> float:
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

    def _tolerance(self, router: Router, scores: RecordResult | None) -> float:
        assert router.g_scores is not None
        m = scores.metrics if scores is not None else None
        expected = scores.expected_error if scores is not None else None
        if expected is None:
            measured = m.error if m is not None and math.isfinite(m.error) else 0.0
            expected = max(measured, rounding_floor(m.dtype if m is not None else "float32"))
        absmax = float(router.g_scores.abs().max()) if router.g_scores.numel() else 0.0
        return margin_tolerance(expected, self.profile.amplification, absmax)

    def verdict(
        self, router: Router, idx: Metrics, scores: RecordResult | None
    ) -> tuple[str, Metrics]:
        """The router's verdict, (status, its indices' metrics with the note): from its
        judged ``scores`` record, the margins the re-routed tokens crossed against what
        the scores' expected error lets rounding cross."""
        scores_ok = scores is None or scores.status == "pass"
        if router.same is not None and bool(router.same.all()):
            # the same experts for every token: identical routing is never a finding (its
            # scores are judged as floats at their own record)
            note = f"every one of {router.tokens} tokens routed alike (the same experts)"
            return "pass", idx.model_copy(update={"note": note, "rerouted": 0})
        if router.same is not None and not router.ranked:
            return _unranked_verdict(router, idx, scores_ok)
        if router.same is None or router.g_scores is None:
            return self._stats_verdict(router, idx, scores, scores_ok)
        return self._margin_verdict(router, idx, scores, scores_ok)

    def _stats_verdict(
        self, router: Router, idx: Metrics, scores: RecordResult | None, scores_ok: bool
    ) -> tuple[str, Metrics]:
        """Statistics only (or no ranking scores): the choice follows from the scores,
        unless more indices differ than the near-ties can account for."""
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

    def _margin_verdict(
        self, router: Router, idx: Metrics, scores: RecordResult | None, scores_ok: bool
    ) -> tuple[str, Metrics]:
        """Full tensors and ranking scores: each re-routed token's golden margin crossed
        against what the scores' expected error lets rounding cross."""
        import torch

        assert router.same is not None and router.g_scores is not None
        assert router.g_idx is not None and router.a_idx is not None
        moved = (~router.same).nonzero().flatten()
        tol = self._tolerance(router, scores)
        g_scores, g_idx, a_idx = router.g_scores, router.g_idx, router.a_idx
        jumped = router.jumped if router.jumped is not None else torch.zeros_like(router.same)
        # a token that kept its experts while a decision inside the router flipped sat at its
        # closest pair of scores among its top k + 1; a re-routed one crossed the margin
        # between the experts it swapped
        margins = [
            float(gaps(g_scores[t : t + 1], router.k)[0])
            if jumped[t]
            else crossed(g_scores[t], g_idx[t], a_idx[t])
            for t in moved.tolist()
        ]
        worst = max(margins, default=0.0)
        # the actual's own scores are not a bound: a router that ranks scores rounded to
        # bf16 (Qwen2-MoE's probabilities) ties where its logits did not
        beyond = sum(m > tol for m in margins)
        moved_text = _moved(router, int(moved.numel()))
        if beyond:
            note = (
                f"{moved_text}, {beyond} of them across a score margin "
                f"(largest {worst:.3g}) beyond what the scores' expected error lets rounding "
                f"cross ({tol:.3g}): the top-k choice itself differs, not only its scores"
            )
        else:  # some token moved: routing alike everywhere is settled in verdict()
            note = (
                f"{moved_text}, each a near-tie: the largest score "
                f"margin crossed {worst:.3g} is within what the scores' expected error lets "
                f"rounding cross ({tol:.3g})"
            )
        status = "pass" if not beyond and scores_ok else "fail"
        update = {
            "note": note,
            "rerouted": int(moved.numel()),
            "reroute_margin": worst,
            "reroute_tolerance": tol,
        }
        return status, idx.model_copy(update=update)

    def _beyond_near_ties(self, router: Router, scores: RecordResult | None) -> str | None:
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


def _moved(router: Router, moved: int) -> str:
    """ "N of T tokens re-routed", with how many of them kept their experts while a decision
    inside the router flipped (routing_find.py's ``mark_decisions``)."""
    text = f"{moved} of {router.tokens} tokens re-routed"
    jumped = 0 if router.jumped is None else int(router.jumped.sum())
    if jumped:
        text += f" ({jumped} to the same experts, at a decision inside the router that flipped)"
    return text


def _unranked_verdict(router: Router, idx: Metrics, scores_ok: bool) -> tuple[str, Metrics]:
    """A router none of whose outputs ranks its indices: the re-routed tokens counted, the
    choice judged from its scores (the margins crossed are not measured)."""
    moved_n = router.rerouted()
    note = (
        f"{_moved(router, moved_n)}; no output of {router.module} ranks "
        "its indices (a learned bias, a group-limited top-k, a sampled choice), so the margins "
        "they crossed are not measured: judged from its scores "
        + ("(they pass)" if scores_ok else "(they fail)")
    )
    return ("pass" if scores_ok else "fail"), idx.model_copy(
        update={"note": note, "rerouted": moved_n}
    )


def by_keys(
    results: Iterable[RecordResult], keys: Collection[str], *, measured: bool = True
) -> dict[str, RecordResult]:
    """The records of ``results`` whose key is one of ``keys`` (with ``measured``, only those
    with metrics), by key; the others are read and let go (a step may hold millions)."""
    if not keys:
        return {}
    return {r.key: r for r in results if r.key in keys and (r.metrics is not None or not measured)}
