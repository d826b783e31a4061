"""The gathering math: statistics of shards combine into the whole tensor's, exactly."""

from __future__ import annotations

import math

import pytest
import torch

from precguard import Stats
from precguard.capture.stats import StatsBuffer
from precguard.layout.combine import concat_shape, concat_stats, sum_partials, tensor_stats

FIELDS = ("min", "max", "mean", "std", "absmax", "l2")


def _close(a: Stats, b: Stats, rel: float) -> None:
    for f in FIELDS:
        x, y = getattr(a, f), getattr(b, f)
        assert (math.isnan(x) and math.isnan(y)) or math.isclose(x, y, rel_tol=rel), (f, x, y)
    for f in ("nan", "inf", "zeros", "numel"):
        assert getattr(a, f) == getattr(b, f), f


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_shard_statistics_combine_to_the_whole_tensors(dim):
    g = torch.Generator().manual_seed(3)
    whole = torch.randn(6, 10, generator=g, dtype=torch.float64) * 3 + 100  # |mean| >> std
    whole[0, :3] = 0.0
    shards = whole.tensor_split([2, 5], dim=dim)  # unequal shards
    combined = concat_stats([tensor_stats(s) for s in shards])
    # each statistic is an exact identity of the shards'; only fp64 rounding remains
    _close(combined, tensor_stats(whole), rel=1e-12)
    assert combined.zeros == 3 and combined.numel == 60


def test_combined_statistics_are_those_the_recorder_writes_for_the_whole():
    g = torch.Generator().manual_seed(4)
    whole = torch.randn(8, 16, generator=g)
    buf = StatsBuffer()
    for t in (whole, *whole.chunk(4, dim=1)):
        buf.add(t)
    recorded = [Stats(**s) for s in buf.materialize()]
    # the recorder reduces float32 tensors in float32: agreement to float32 rounding
    _close(concat_stats(recorded[1:]), recorded[0], rel=1e-5)


def test_a_nan_in_one_shard_makes_the_whole_nan_and_is_counted():
    a = torch.tensor([1.0, float("nan"), float("inf")], dtype=torch.float64)
    b = torch.tensor([0.0, -2.0], dtype=torch.float64)
    combined = concat_stats([tensor_stats(a), tensor_stats(b)])
    assert math.isnan(combined.max) and math.isnan(combined.std)
    assert (combined.nan, combined.inf, combined.zeros, combined.numel) == (1, 1, 1, 5)


def test_an_inf_without_nan_keeps_the_extremes():
    a = torch.tensor([1.0, float("inf")], dtype=torch.float64)
    b = torch.tensor([-3.0, 2.0], dtype=torch.float64)
    combined = concat_stats([tensor_stats(a), tensor_stats(b)])
    assert combined.max == math.inf and combined.min == -3.0 and combined.inf == 1


def test_partial_sums_add_in_fp64_and_round_once():
    # 1 + 2^-24 + 2^-24 in float32: adding in order loses both halves, fp64 keeps them
    parts = [torch.tensor([1.0]), torch.tensor([2.0**-24]), torch.tensor([2.0**-24])]
    assert sum_partials(parts).item() == 1.0 + 2.0**-23
    assert sum_partials(parts).dtype == torch.float32


def test_shapes_concatenate_only_where_the_other_dims_agree():
    assert concat_shape([[2, 3], [2, 5]], -1) == [2, 8]
    assert concat_shape([[2, 3], [4, 3]], 0) == [6, 3]
    assert concat_shape([[2, 3], [4, 5]], 0) is None
    assert concat_shape([[2, 3], [2, 3]], 2) is None
    assert concat_shape([[], []], 0) is None
