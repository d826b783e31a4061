"""A router's followers measured on the rows both runs routed alike: token rows and values
per chosen expert paired by token and expert, rows inside the experts by the layout both
runs formed (expert_rows.py); a follower whose error feeds its consumers keeps its error
over every row beside.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from precguard.compare.expert_rows import common_rows, pair_layouts, rows_of
from precguard.compare.levels import MeasuredMetrics, concentrated
from precguard.compare.metrics import precision, tensor_metrics
from precguard.compare.report import Metrics, RecordResult, RecordRows
from precguard.compare.routing_find import Follower, Pair
from precguard.compare.routing_judge import RouterJudge, by_keys
from precguard.compare.tolerance import Profile
from precguard.numerics import scale_excess

if TYPE_CHECKING:
    import torch


def _excess(m: Metrics, profile: Profile) -> float:
    """How far a scale lies beyond ``bias_z`` standard errors from 1 (-inf: not measured)."""
    if not isinstance(m, MeasuredMetrics):
        return -math.inf
    return scale_excess(m.scale, m.scale_se, profile.bias_z)


class RowsRemeasure(RouterJudge):
    """Re-measuring the followers of each router on the rows routed alike."""

    def remeasure(self, results: RecordRows) -> RecordRows:
        """Results with the followers' metrics measured on the rows both runs routed alike
        (full tensors), and the routers' indices marked as judged here."""
        if not self.followers:
            return results
        out = RecordRows()
        by_key = by_keys(results, self.verdict_keys())
        for r in results:
            f = self.followers.get(r.key)
            if f is None or r.metrics is None or r.status == "missing":
                out.append(r)
                continue
            out.append(self._remeasured(r, r.metrics, f, by_key))
        return out

    def _remeasured(
        self, r: RecordResult, m: Metrics, f: Follower, by_key: dict[str, RecordResult]
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
        if rows is None or rows[0].numel() == 0:
            return r
        g_rows, a_rows = rows
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

    def _worst_expert(self, f: Follower, alike: Metrics) -> tuple[int, Metrics | None]:
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

    def _rows_for(self, f: Follower) -> tuple[torch.Tensor, torch.Tensor] | None:
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

    def _grouped_rows(self, f: Follower) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Rows sorted by expert (``grouped_mm``), each expert's rows in an order its sort
        does not fix: within each expert's group, the rows of the tokens both runs sent to
        it, paired by value (mutual nearest rows; one token's rows differ by rounding,
        two tokens' by their whole size)."""
        import torch

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
        for e in torch.cat([router.g_idx.flatten(), router.a_idx.flatten()]).unique().tolist():
            g_tok = set(torch.where(router.g_idx.eq(e))[0].tolist())
            a_tok = set(torch.where(router.a_idx.eq(e))[0].tolist())
            gi = torch.arange(g_start, g_start + len(g_tok))
            ai = torch.arange(a_start, a_start + len(a_tok))
            g_start, a_start = g_start + len(g_tok), a_start + len(a_tok)
            common = len(g_tok & a_tok)
            if not common:
                continue
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

    def _expert_columns(self, f: Follower, rows: torch.Tensor) -> torch.Tensor:
        """Per token routed alike: the actual's column of each golden column's expert (a
        value per chosen expert is paired by the expert, not by its place in the top-k)."""
        import torch

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
