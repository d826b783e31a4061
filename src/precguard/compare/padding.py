"""Padded positions and attention masks: what a batch's ``attention_mask`` says no one reads.

What a model computes at a padded query position (``attention_mask == 0``) is undefined,
and nothing downstream reads it, so compare learns the padding from the root call's 2-d
``attention_mask`` keyword input (recorded in full on either side) and measures every
forward float record of that call led by ``[batch, seq]`` or ``[batch, heads, seq, ...]``
over the real positions only: full tensors zeroed at padded positions on both sides,
statistics with the golden's evidence at padded positions. The same mask reaching the
layers as an additive float mask on one side and a boolean one on the other is compared
as masks (:func:`mask_metrics`). See docs/compare.md, "Padded positions".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from precguard.capture.evidence import encode, sample_indices
from precguard.compare.levels import StatsMetrics
from precguard.compare.metrics import exact_metrics, is_float_dtype
from precguard.compare.report import Metrics
from precguard.dump.schema import PositionNorms, Record, Sample, Stats
from precguard.dump.tensors import TensorStore
from precguard.numerics import MASK_FILL_MAX

if TYPE_CHECKING:
    import torch

#: the keyword input whose zeros mark padded positions (HF's name, which every
#: transformers model and most hand-written ones take)
MASK_NAME = "attention_mask"


class LeftOut(BaseModel):
    """What padding left out of one comparison's metrics (summed over its units)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    positions: int = Field(
        default=0, description="Padded (batch, position) pairs of the root calls left out."
    )
    records: int = Field(
        default=0, description="Records measured over their real positions only (full tensors)."
    )
    stats_records: int = Field(
        default=0,
        description="Statistics-only records whose error was estimated from the sampled "
        "elements and position norms of real positions only.",
    )
    unknown: int = Field(
        default=0,
        description="Padded positions whose place is unknown: the attention_mask was recorded "
        "as statistics only on both sides, so they were not left out.",
    )

    def __add__(self, other: LeftOut) -> LeftOut:
        return LeftOut(**{k: v + getattr(other, k) for k, v in self})


def padding_note(left: LeftOut) -> str | None:
    """The comparison's line about padding (None when there was none)."""
    parts = []
    if left.records or left.stats_records:
        kinds = []
        if left.records:
            kinds.append(f"{left.records} records on full tensors")
        if left.stats_records:
            kinds.append(
                f"{left.stats_records} statistics-only records (estimated from the sampled "
                "elements and position norms of real positions)"
            )
        parts.append(
            f"{left.positions} padded positions (attention_mask = 0) left out of the hidden "
            f"states, attention and MLP outputs and logits: {', '.join(kinds)}; what a model "
            "computes at a padded query position is undefined and nothing reads it"
        )
    if left.unknown:
        parts.append(
            f"the attention_mask marks {left.unknown} padded positions but was recorded as "
            "statistics only, so padded positions could not be left out of the hidden states "
            "(an error there may be padding, not the model): record the root's inputs in "
            "full (--tensors root, or tensors=['root'])"
        )
    return "; ".join(parts) or None


@dataclass(frozen=True)
class _Call:
    """One root call of a step on one side: its records' seq range and its mask."""

    start: int
    end: float
    #: True at real tokens, [batch, seq]; None when only statistics of the mask exist
    keep: torch.Tensor | None
    padded: int


def _root_calls(records: list[Record], store: TensorStore) -> list[_Call]:
    """The root calls of one step that took a 2-d ``attention_mask`` with padded positions."""
    spans: dict[int, list[int]] = {}
    masks: dict[int, Record] = {}
    for rec in records:
        if rec.module != "root" or rec.phase != "forward":
            continue
        span = spans.setdefault(rec.call, [rec.seq, -1])
        span[0] = min(span[0], rec.seq)
        if rec.role == "output":
            span[1] = max(span[1], rec.seq)
        if rec.role == "input" and rec.name.rsplit(".", 1)[-1] == MASK_NAME:
            masks.setdefault(rec.call, rec)
    starts = sorted(s[0] for s in spans.values())
    out = []
    for call, rec in masks.items():
        if len(rec.shape) != 2 or rec.stats is None or rec.stats.zeros in (None, 0):
            continue
        start, last = spans[call]
        later = [s for s in starts if s > start]
        end: float = last if last >= 0 else (later[0] - 1 if later else math.inf)
        keep = store.tensor(rec) != 0 if rec.tensor is not None else None
        out.append(_Call(start, end, keep, int(rec.stats.zeros or 0)))
    return out


def _call_of(calls: list[_Call], seq: int) -> _Call | None:
    return next((c for c in calls if c.start <= seq <= c.end), None)


def _layout(shape: list[int], keep: torch.Tensor) -> torch.Tensor | None:
    """``keep`` shaped to broadcast over a record of ``shape``: ``[batch, seq, ...]``, else
    ``[batch, heads, seq, ...]`` (4-d: per-head queries, attention weights, a 4-d mask);
    None when neither."""
    batch, seq = keep.shape
    if len(shape) >= 2 and shape[0] == batch and shape[1] == seq:
        return keep.reshape(batch, seq, *([1] * (len(shape) - 2)))
    if len(shape) == 4 and shape[0] == batch and shape[2] == seq:
        return keep.reshape(batch, 1, seq, 1)
    return None


class StepPadding:
    """The padded positions of one step's root calls, on both sides, and what was left out."""

    def __init__(self, golden: list[_Call], actual: list[_Call]) -> None:
        self._golden = golden
        self._actual = actual
        self._records = 0
        self._stats_records = 0
        #: the calls (the golden's where both sides have them) whose padding was used or
        #: could not be: their padded positions, by id
        self._used: dict[int, int] = {}
        self._unknown: dict[int, int] = {}

    @classmethod
    def of_step(
        cls, g_recs: list[Record], a_recs: list[Record], g_store: TensorStore, a_store: TensorStore
    ) -> StepPadding:
        """Read the root calls' masks of one step (empty when no call was padded)."""
        return cls(_root_calls(g_recs, g_store), _root_calls(a_recs, a_store))

    def _keep(self, g: Record, a: Record) -> torch.Tensor | None:
        """The mask of the root call ``g`` and ``a`` belong to, shaped for them (None:
        nothing to leave out)."""
        if g.phase != "forward" or (g.module == "root" and g.role == "input"):
            return None
        if not (is_float_dtype(g.dtype) or is_float_dtype(a.dtype)):
            return None
        gc, ac = _call_of(self._golden, g.seq), _call_of(self._actual, a.seq)
        call = gc or ac
        if call is None:
            return None
        known = [c for c in (gc, ac) if c is not None and c.keep is not None]
        if not known:
            self._unknown[id(call)] = call.padded
            return None
        if len(known) == 2 and not known[0].keep.equal(known[1].keep):
            return None  # the two runs were fed other masks: compare names that input
        keep = known[0].keep
        assert keep is not None
        shaped = _layout(list(g.shape), keep)
        if shaped is None:
            return None
        self._used[id(call)] = call.padded
        # no real position: zeroing every element would compare nothing and pass, so the
        # record is compared as recorded
        return None if keep.all() or not keep.any() else shaped

    def full(
        self, g: Record, a: Record, golden: torch.Tensor, actual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Both full tensors, zero at padded positions (None: nothing to leave out)."""
        import torch

        keep = self._keep(g, a)
        if keep is None:
            return None
        if golden.shape != actual.shape:
            actual = actual.reshape(golden.shape)
        self._records += 1
        zero = torch.zeros((), dtype=golden.dtype)
        return torch.where(keep, golden, zero), torch.where(keep, actual, zero.to(actual.dtype))

    def stats(self, g: Record, a: Record, measure: Callable[[Record, Record], Metrics]) -> Metrics:
        """``measure(g, a)``, or, when padding applies, of ``a`` with the golden's evidence
        at padded positions and the golden's overall statistics (they mix padded and real
        positions: not judged). The non-finite counts stay the actual's: a NaN is never
        hidden. A pair that keeps neither a sample nor position norms is measured as is.
        """
        keep = self._keep(g, a)
        if keep is None or g.stats is None or a.stats is None:
            return measure(g, a)
        sample = _kept_sample(g, a, keep)
        positions = _kept_positions(g, a, keep)
        if sample is None and positions is None:
            return measure(g, a)
        update: dict[str, object] = {
            "stats": g.stats.model_copy(update={"nan": a.stats.nan, "inf": a.stats.inf}),
            "sample": sample if sample is not None else a.sample,
            "positions": positions if positions is not None else a.positions,
        }
        self._stats_records += 1
        metrics = measure(g, a.model_copy(update=update))
        return metrics.model_copy(
            update={
                "stat_rel_diff": None,
                "note": "padded positions left out: the error is estimated from the sampled "
                "elements and position norms of real positions (the overall statistics mix "
                f"in padded ones and are not judged). {metrics.note or ''}".strip(),
            }
        )

    def left_out(self) -> LeftOut:
        """What this step's pairs left out so far."""
        return LeftOut(
            positions=sum(self._used.values()),
            records=self._records,
            stats_records=self._stats_records,
            unknown=sum(n for c, n in self._unknown.items() if c not in self._used),
        )


def _kept_sample(g: Record, a: Record, keep: torch.Tensor) -> Sample | None:
    """The actual's sample with the golden's values at padded positions."""
    gs, as_ = g.sample, a.sample
    if gs is None or as_ is None or gs.seed != as_.seed:
        return None
    gv, av = gs.array(), as_.array()
    index = sample_indices(tuple(g.shape))
    if gv.size != av.size or index.size != gv.size:
        return None
    full = np.broadcast_to(keep.numpy(), tuple(g.shape)).reshape(-1)
    padded = ~full[index]
    av = np.where(padded, gv, av).astype(np.float64 if as_.dtype == "float64" else np.float32)
    return as_.model_copy(update={"values": encode(av)})


def _kept_positions(g: Record, a: Record, keep: torch.Tensor) -> PositionNorms | None:
    """The actual's position norms with the golden's at bins holding a padded position."""
    gp, ap = g.positions, a.positions
    if gp is None or ap is None or (gp.dim, gp.bin, gp.length) != (ap.dim, ap.bin, ap.length):
        return None
    seq_dim = 1 if keep.shape[1] == g.shape[1] else 2
    if gp.dim != seq_dim or gp.length != keep.shape[1]:
        return None
    gn, an = gp.array(), ap.array()
    padded = ~keep.reshape(keep.shape[0], -1).all(0).numpy()
    # a bin holds a padded position: positions laid out as [bins, bin] (the last bin may
    # be short, its tail not padded)
    cover = np.zeros(gn.size * gp.bin, dtype=bool)
    cover[: padded.size] = padded[: cover.size]
    bins = cover.reshape(gn.size, gp.bin).any(axis=1)
    an = np.where(bins, gn, an).astype(np.float64 if ap.dtype == "float64" else np.float32)
    return ap.model_copy(update={"norms": encode(an)})


def _as_attend(t: torch.Tensor) -> torch.Tensor | None:
    """Where an attention mask lets a query attend: a bool mask itself; an additive float
    mask's zeros, when it holds nothing but 0 and one negative fill (``finfo.min``, -inf)."""
    import torch

    if t.dtype == torch.bool:
        return t
    if not t.is_floating_point() or t.numel() == 0:
        return None
    low = t.min()
    if not bool(low < 0) or not bool(((t == 0) | (t == low)).all()):
        return None
    return t == 0


def mask_metrics(
    g: Record, a: Record, golden: torch.Tensor, actual: torch.Tensor, padding: StepPadding
) -> Metrics | None:
    """Compare a boolean attention mask with an additive float one as masks (else None),
    or two additive masks whose fills differ (:func:`_fills_differ`), position by
    position; query rows at padded positions are left out like every padded position.
    """
    import torch

    both_float = golden.dtype != torch.bool and actual.dtype != torch.bool
    if (golden.dtype == torch.bool) == (actual.dtype == torch.bool) and not (
        both_float and _two_fills(g.stats, a.stats)  # the statistics say so before a pass
    ):
        return None
    g_attend, a_attend = _as_attend(golden), _as_attend(actual.reshape(golden.shape))
    if g_attend is None or a_attend is None:
        return None
    if both_float and not _fills_differ(float(golden.min()), float(actual.min())):
        return None  # one additive mask in one format: compared as values
    kept = padding.full(g, a, g_attend, a_attend)
    if kept is not None:
        g_attend, a_attend = kept
    note = (
        f"compared as attention masks: 0 where a query attends, fill {float(golden.min()):.3g}"
        f" (golden) against {float(actual.min()):.3g} (actual), each masking a key outright"
        if both_float
        else "compared as attention masks: True where a query attends (bool) against "
        "0 where it attends (additive float)"
    )
    return exact_metrics(g_attend, a_attend).model_copy(update={"note": note})


def mask_stats_metrics(g: Record, a: Record) -> Metrics | None:
    """A boolean attention mask against an additive float one, or two additive masks whose
    fills differ, from their statistics (else None).

    A float mask's zeros are the positions attended, a boolean's zeros those masked:
    equal counts of attended positions are the evidence statistics can give; the padded
    query rows cannot be told apart here.
    """
    gs, as_ = g.stats, a.stats
    if gs is None or as_ is None or (g.dtype == "bool" and a.dtype == "bool"):
        return None
    if g.dtype != "bool" and a.dtype != "bool":
        if not _two_fills(gs, as_):
            return None
        assert gs.zeros is not None and as_.zeros is not None  # _two_fills checked them
        attended, dtype = (gs.zeros, as_.zeros), g.dtype
        kinds = (f"fill {gs.min:.3g}", f"fill {as_.min:.3g}")
    else:
        boolean, additive = (gs, as_) if g.dtype == "bool" else (as_, gs)
        if (
            boolean.zeros is None
            or additive.zeros is None
            or boolean.numel != additive.numel
            or not _is_additive(additive)
        ):
            return None
        attended, dtype = (boolean.numel - boolean.zeros, additive.zeros), "bool"
        kinds = ("bool", "additive float")
    return StatsMetrics(
        level="stats",
        dtype=dtype,
        error=abs(attended[0] - attended[1]) / max(gs.numel, 1),
        note=f"compared as attention masks from their statistics: {attended[0]} attended "
        f"positions ({kinds[0]}) against {attended[1]} ({kinds[1]}); equal counts suggest "
        "equal masks",
    )


def _fills_differ(golden_fill: float, actual_fill: float) -> bool:
    """Two additive masks' fills are one mask in two formats: they differ, and each masks a
    key outright (:data:`precguard.numerics.MASK_FILL_MAX`; fp16's -65504 against fp32's
    ``finfo.min``: compared as floats they differ by 100 %)."""
    return golden_fill != actual_fill and max(golden_fill, actual_fill) < MASK_FILL_MAX


def _is_additive(stats: Stats) -> bool:
    """Statistics of 0 and one negative fill: max 0, the min the only other extreme."""
    return stats.max == 0 and stats.min < 0 and stats.absmax == -stats.min


def _two_fills(gs: Stats | None, as_: Stats | None) -> bool:
    """The statistics of two additive masks of one size whose fills differ, each masking
    a key outright (:func:`_fills_differ`)."""
    return (
        gs is not None
        and as_ is not None
        and gs.zeros is not None
        and as_.zeros is not None
        and gs.numel == as_.numel
        and _is_additive(gs)
        and _is_additive(as_)
        and _fills_differ(gs.min, as_.min)
    )
