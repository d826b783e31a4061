"""Statistics msprobe did not measure are unknown, and compare judges only what both have."""

from __future__ import annotations

import math

from precguard import Record, Stats
from precguard.compare.metrics import stats_metrics


def _record(stats: Stats) -> Record:
    return Record(
        key="lin.0.forward.output.0",
        module="lin",
        module_type="Linear",
        call=0,
        phase="forward",
        role="output",
        index=0,
        step=0,
        rank=0,
        seq=0,
        dtype="float32",
        shape=[6],
        stats=stats,
    )


def _precguard(**over: float) -> Stats:
    values = dict(min=-2.0, max=3.0, mean=0.5, std=1.9, absmax=3.0, l2=4.7, nan=0, inf=0)
    values.update(over)
    return Stats(**values, zeros=1, numel=6)


def _msprobe(**over: float) -> Stats:
    values = dict(min=-2.0, max=3.0, mean=0.5, absmax=3.0, l2=4.7)
    values.update(over)
    return Stats(**values, numel=6)  # std, nan, inf, zeros: not measured by msprobe


def test_only_statistics_both_sides_recorded_are_compared() -> None:
    m = stats_metrics(_record(_precguard()), _record(_msprobe()), dtype="float32")
    assert set(m.stat_rel_diff) == {"min", "max", "mean", "absmax", "l2"}
    assert m.error == 0.0 and m.nan_mismatch == 0 and m.inf_mismatch == 0

    m = stats_metrics(_record(_precguard()), _record(_msprobe(l2=4.8)), dtype="float32")
    assert math.isclose(m.stat_rel_diff["l2"], 0.1 / 4.7)


def test_nan_and_inf_are_compared_by_presence_where_a_count_is_unknown() -> None:
    inf = math.inf
    # +Inf and -Inf in one tensor: its mean is NaN, yet it holds no NaN
    both = _precguard(min=-inf, max=inf, mean=math.nan, absmax=inf, l2=inf, inf=2)
    dumped = _msprobe(min=-inf, max=inf, mean=math.nan, absmax=inf, l2=inf)
    assert not dumped.has_nan and dumped.has_inf
    m = stats_metrics(_record(both), _record(dumped), dtype="float32")
    assert m.nan_mismatch == 0 and m.inf_mismatch == 0

    with_nan = _msprobe(max=math.nan, mean=math.nan, absmax=math.nan, l2=math.nan)
    m = stats_metrics(_record(_precguard()), _record(with_nan), dtype="float32")
    assert m.nan_mismatch == 1
