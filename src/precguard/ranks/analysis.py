"""Within one multi-rank recording: do the replicas agree, and where did a NaN start and spread?

What must be identical across ranks, whatever data each rank saw:

* **parameters** of data-parallel replicas (``param`` records): DDP broadcasts
  them at start and every replica applies the same averaged gradient, so a
  parameter that differs at step k means the replicas drifted before it
  (a gradient left out of the all-reduce, a rank-local clipping or optimizer
  bug, a faulty device). Record with ``params="every_step"`` to see every step.
* the **output of a collective that leaves every rank the same value**
  (``all_reduce``, ``all_gather``, ``broadcast``), across the ranks of its own
  process group.

Activations and local gradients differ between data-parallel ranks by design
(each rank has its own batch) and are not compared.

Equality is judged on full tensors bit for bit when every rank saved them,
else on the statistics: exactly for those that do not depend on summation
order (min, max, absmax, NaN/Inf/zero counts, numel, dtype, shape) and within
``rtol`` for the sums (mean, std, l2), which a different thread count may
round differently even for identical tensors.

The non-finite scan names the first rank that held a NaN/Inf (earliest step,
then capture order), and the first collective whose input was finite on some
ranks of its group and non-finite on others while its output was non-finite
on every rank: the collective that spread it.

Memory holds one step of every rank's records at a time.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from itertools import groupby
from typing import Any

from precguard._logging import get_logger
from precguard.dump.reader import Run, load_run
from precguard.dump.schema import Record
from precguard.errors import UsageError
from precguard.ranks.order import reduction_spread
from precguard.ranks.report import (
    Disagreement,
    NonFiniteOrigin,
    OrderSpread,
    RanksReport,
    Spread,
)

logger = get_logger(__name__)

#: collectives whose output is the same on every rank of the group
REPLICATED_OUTPUTS = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_single",
        "all_gather_tensor",
        "broadcast",
    }
)
#: collectives whose output on each rank combines every rank's input (a NaN spreads)
MIXING = REPLICATED_OUTPUTS | {"reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single"}

_EXACT_STATS = ("min", "max", "absmax", "nan", "inf", "zeros", "numel")
_SUM_STATS = ("mean", "std", "l2")


def check_replicas(
    run: str | os.PathLike[str] | Run,
    *,
    groups: Sequence[Sequence[int]] | None = None,
    step: int | None = None,
    rtol: float = 1e-6,
) -> RanksReport:
    """Check that the data-parallel replicas of one recording agree; find NaN/Inf spread.

    :param run: a recording of a multi-rank run.
    :param groups: the data-parallel groups (ranks holding replicas of the same
        parameters); default: every rank is a replica of every other (pure DP).
    :param step: check only this step.
    :param rtol: relative tolerance on order-dependent statistics (mean, std, l2).
    :raises UsageError: one rank only, or a group naming a rank the run lacks.

    >>> report = check_replicas("runs/ddp")          # doctest: +SKIP
    >>> report.first_nonfinite.rank, report.spread.module   # doctest: +SKIP
    (1, 'dist.all_reduce')
    """
    r = run if isinstance(run, Run) else load_run(run)
    ranks = r.ranks
    if len(ranks) < 2:
        raise UsageError(
            f"{r.path}: ranks {ranks or 'none'}: a replica check needs a recording of two or "
            "more ranks (under torchrun)"
        )
    dp_groups = [sorted(set(g)) for g in groups] if groups else [list(ranks)]
    for g in dp_groups:
        missing = sorted(set(g) - set(ranks))
        if missing:
            raise UsageError(f"{r.path}: group {g} names rank(s) {missing} with no records")
    state = _Scan(r, dp_groups, rtol)
    steps = 0
    for s, by_rank in _steps_of_all_ranks(r, ranks, step):
        steps += 1
        state.step(s, by_rank)
    status = r.rank_status()
    incomplete = [k for k, v in status.items() if v is None or not v.complete]
    warnings = list(state.warnings)
    if incomplete:
        warnings.append(
            f"rank(s) {incomplete} did not complete (killed, raised, or still running): "
            "their records end early"
        )
    if state.compared == 0:
        warnings.append(
            "no record that replicas must share was found (parameters, or outputs of "
            "all_reduce/all_gather/broadcast): record with params='every_step' and the "
            "collectives on; agreement is not shown"
        )
    beyond = any(o.verdict == "beyond_order_noise" for o in state.order)
    bad = state.first_disagreement or state.first_nonfinite or beyond
    return RanksReport(
        run=str(r.path),
        world_size=r.manifest.world_size,
        ranks=ranks,
        groups=dp_groups,
        verdict="disagree" if bad else ("agree" if state.compared else "inconclusive"),
        compared=state.compared,
        steps=steps,
        first_disagreement=state.first_disagreement,
        first_nonfinite=state.first_nonfinite,
        spread=state.spread,
        order=state.order,
        incomplete_ranks=incomplete,
        warnings=warnings,
    )


def _steps_of_all_ranks(
    run: Run, ranks: list[int], only: int | None
) -> Iterator[tuple[int, dict[int, list[Record]]]]:
    """Yield (step, rank -> that step's records) in step order, one step in memory."""
    iters = {k: groupby(run.records(k), key=lambda rec: rec.step) for k in ranks}
    heads: dict[int, tuple[int, list[Record]] | None] = {}

    def advance(k: int) -> None:
        nxt = next(iters[k], None)
        heads[k] = (nxt[0], list(nxt[1])) if nxt is not None else None

    for k in ranks:
        advance(k)
    while True:
        live = [h[0] for h in heads.values() if h is not None]
        if not live:
            return
        s = min(live)
        by_rank = {}
        for k in ranks:
            head = heads[k]
            if head is not None and head[0] == s:
                by_rank[k] = head[1]
                advance(k)
        if only is None or s == only:
            yield s, by_rank
        elif s > only:
            return


def _nonfinite(rec: Record) -> bool:
    return rec.stats is not None and rec.stats.nonfinite > 0


class _Scan:
    """The state of the scan across steps (first findings only)."""

    def __init__(self, run: Run, groups: list[list[int]], rtol: float) -> None:
        self.run = run
        self.groups = groups
        self.rtol = rtol
        self.compared = 0
        self.first_disagreement: Disagreement | None = None
        self.first_nonfinite: NonFiniteOrigin | None = None
        self.spread: Spread | None = None
        self.order: list[OrderSpread] = []
        self.warnings: list[str] = []

    def step(self, s: int, by_rank: dict[int, list[Record]]) -> None:
        keyed = {k: {rec.key: rec for rec in recs} for k, recs in by_rank.items()}
        if self.first_nonfinite is None:
            self._find_nonfinite(by_rank)
        # records in the lowest rank's capture order, so "first" is execution order
        lead = min(by_rank)
        for rec in by_rank[lead]:
            for group in self._groups_of(rec):
                self._check(rec.key, group, keyed, s)
        if self.spread is None:
            self._find_spread(s, keyed)
        self._order_noise(s, keyed)

    def _groups_of(self, rec: Record) -> list[list[int]]:
        if rec.role == "param":
            return [g for g in self.groups if rec.rank in g]
        c = rec.collective
        if c is not None and rec.role == "output" and c.op in REPLICATED_OUTPUTS and c.group:
            return [sorted(c.group)]
        return []

    def _check(
        self, key: str, group: list[int], keyed: dict[int, dict[str, Record]], s: int
    ) -> None:
        recs = {k: keyed[k][key] for k in group if k in keyed and key in keyed[k]}
        if len(recs) < 2:
            return
        self.compared += len(recs)
        if self.first_disagreement is not None:
            return
        found = self._differ(recs)
        if found is None:
            return
        level, signatures, detail = found
        counts: dict[Any, list[int]] = {}
        for k, sig in signatures.items():
            counts.setdefault(sig, []).append(k)
        majority = max(counts.values(), key=lambda ks: (len(ks), -min(ks)))
        if sum(len(ks) == len(majority) for ks in counts.values()) > 1:
            majority = next(ks for ks in counts.values() if min(group) in ks)  # a tie
        any_rec = next(iter(recs.values()))
        self.first_disagreement = Disagreement(
            key=key,
            module=any_rec.module,
            role=any_rec.role,
            step=s,
            group=sorted(recs),
            differing_ranks=sorted(k for k in recs if k not in majority),
            level=level,
            detail=detail,
        )

    def _differ(self, recs: dict[int, Record]) -> tuple[str, dict[int, Any], str] | None:
        """None when the records agree; else (level, rank -> signature, what differs)."""
        if all(rec.tensor is not None for rec in recs.values()):
            import torch

            tensors = {k: self.run.tensor(rec) for k, rec in recs.items()}
            first = next(iter(tensors.values()))
            sigs: dict[int, Any] = {}
            for k, t in tensors.items():
                same = t.dtype == first.dtype and t.shape == first.shape
                same = same and bool(torch.equal(t.view(torch.uint8), first.view(torch.uint8)))
                sigs[k] = 0 if same else hash(t.view(torch.uint8).numpy().tobytes())
            if len(set(sigs.values())) == 1:
                return None
            return "tensor", sigs, "full tensors differ bit for bit"
        sigs = {}
        lead_rank, lead = next(iter(recs.items()))
        detail = ""
        for k, rec in recs.items():
            what = self._stats_differ(lead, rec)
            if what is not None and not detail:
                detail = f"{what[0]} {what[1]!r} (rank {lead_rank}) vs {what[2]!r} (rank {k})"
            sigs[k] = self._signature(rec)
        if not detail:
            return None
        return "stats", sigs, detail

    def _stats_differ(self, a: Record, b: Record) -> tuple[str, Any, Any] | None:
        if a.dtype != b.dtype:
            return "dtype", a.dtype, b.dtype
        if a.shape != b.shape:
            return "shape", a.shape, b.shape
        if a.stats is None or b.stats is None:
            return None
        for name in _EXACT_STATS:
            x, y = getattr(a.stats, name), getattr(b.stats, name)
            if x != y and not (_isnan(x) and _isnan(y)):
                return name, x, y
        for name in _SUM_STATS:
            x, y = getattr(a.stats, name), getattr(b.stats, name)
            if _isnan(x) and _isnan(y):
                continue
            if not abs(x - y) <= self.rtol * max(abs(x), abs(y)):
                return name, x, y
        return None

    @staticmethod
    def _signature(rec: Record) -> Any:
        st = rec.stats
        exact = tuple(getattr(st, n) for n in _EXACT_STATS) if st is not None else None
        return (rec.dtype, tuple(rec.shape), repr(exact))

    def _find_nonfinite(self, by_rank: dict[int, list[Record]]) -> None:
        firsts = []
        for k, recs in by_rank.items():
            rec = next((x for x in recs if _nonfinite(x)), None)
            if rec is not None:
                firsts.append((rec.seq, k, rec))
        if not firsts:
            return
        _seq, k, rec = min(firsts, key=lambda f: (f[0], f[1]))
        assert rec.stats is not None
        self.first_nonfinite = NonFiniteOrigin(
            rank=k, key=rec.key, module=rec.module, step=rec.step, nan=rec.stats.nan,
            inf=rec.stats.inf,
        )  # fmt: skip

    def _collective_calls(
        self, keyed: dict[int, dict[str, Record]]
    ) -> Iterator[tuple[str, list[int], dict[int, list[Record]], dict[int, list[Record]]]]:
        """(module.call, group, rank -> inputs, rank -> outputs) per collective call."""
        lead = min(keyed)
        seen: set[tuple[str, int]] = set()
        for rec in keyed[lead].values():
            c = rec.collective
            if c is None or not c.group or (rec.module, rec.call) in seen:
                continue
            seen.add((rec.module, rec.call))
            prefix = f"{rec.module}.{rec.call}.{rec.phase}."
            ins: dict[int, list[Record]] = {}
            outs: dict[int, list[Record]] = {}
            for k in c.group:
                for key, x in keyed.get(k, {}).items():
                    if key.startswith(prefix + "input."):
                        ins.setdefault(k, []).append(x)
                    elif key.startswith(prefix + "output."):
                        outs.setdefault(k, []).append(x)
            yield f"{rec.module}.{rec.call}", sorted(c.group), ins, outs

    def _find_spread(self, s: int, keyed: dict[int, dict[str, Record]]) -> None:
        for name, group, ins, outs in self._collective_calls(keyed):
            module, call = name.rsplit(".", 1)
            op = module.removeprefix("dist.")
            if op not in MIXING or set(ins) != set(group) or set(outs) != set(group):
                continue
            bad_in = [k for k in group if any(_nonfinite(x) for x in ins[k])]
            bad_out = [k for k in group if any(_nonfinite(x) for x in outs[k])]
            if bad_in and len(bad_in) < len(group) and set(bad_out) - set(bad_in):
                self.spread = Spread(
                    module=module,
                    op=op,
                    call=int(call),
                    step=s,
                    group=group,
                    from_ranks=bad_in,
                    to_ranks=bad_out,
                )
                return

    def _order_noise(self, s: int, keyed: dict[int, dict[str, Record]]) -> None:
        for name, group, ins, outs in self._collective_calls(keyed):
            module, call = name.rsplit(".", 1)
            first = next(iter(ins.values()), [None])[0]
            if first is None or first.collective is None or first.collective.op != "all_reduce":
                continue
            if set(ins) != set(group) or set(outs) != set(group):
                continue
            recs_in = [ins[k][0] for k in group]
            recs_out = [outs[k][0] for k in group]
            if any(x.tensor is None for x in recs_in + recs_out):
                continue
            if any(_nonfinite(x) for x in recs_in):
                continue
            found = reduction_spread(
                [self.run.tensor(x) for x in recs_in],
                [self.run.tensor(x) for x in recs_out],
                first.collective.reduce_op,
            )
            if found is None:
                continue
            orders, noise, error, ratio = found
            self.order.append(
                OrderSpread(
                    module=module,
                    call=int(call),
                    step=s,
                    orders=orders,
                    order_noise=noise,
                    error=error,
                    bound_ratio=ratio,
                    verdict="order_noise" if ratio <= 1.0 else "beyond_order_noise",
                )
            )


def _isnan(x: Any) -> bool:
    return isinstance(x, float) and math.isnan(x)
