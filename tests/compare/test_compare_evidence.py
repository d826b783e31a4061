"""Evidence in statistics-mode records: sampled elements and per-position norms.

The user story: a golden recorded with every tensor, the run under test with
statistics only (the README's flow). Statistics of RoPE's cos/sin barely move
when late positions' angles are off; the sample and the per-position norms
show the error and where it sits.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

import precguard
from precguard.capture.evidence import (
    POSITION_BINS,
    SAMPLE_SIZE,
    sample_indices,
    sample_seed,
    sequence_dim,
)
from precguard.capture.stats import StatsBuffer
from precguard.compare.expected import rounding_floor
from precguard.compare.metrics import stats_metrics


def evidence_of(t: torch.Tensor, *, defer: bool, positions: bool = True) -> dict:
    buf = StatsBuffer(defer=defer)
    slot, _ = buf.add(t, positions=positions)
    _, evidence = buf.materialize_with_evidence()
    assert evidence[slot] is not None
    return evidence[slot]


@pytest.mark.parametrize("defer", [False, True], ids=["cpu-path", "deferred-path"])
def test_sample_holds_the_elements_at_indices_chosen_from_the_shape(defer):
    torch.manual_seed(0)
    # (batch, heads, seq, head_dim) = (2, 4, 300, 16), a transposed view: not contiguous
    x = torch.randn(2, 300, 4, 16).transpose(1, 2)
    from precguard import Sample

    got = Sample(**evidence_of(x, defer=defer)["sample"]).array()
    idx = sample_indices(tuple(x.shape))
    assert len(idx) == SAMPLE_SIZE == len(set(idx.tolist()))
    np.testing.assert_array_equal(got, x.reshape(-1)[torch.from_numpy(idx)].double().numpy())
    # the last position is sampled: (batch 1, position 299) is where an error growing
    # with the position is largest
    assert ((idx // 16) % 300 == 299).sum() >= 4


def test_sample_indices_depend_on_the_shape_only():
    assert np.array_equal(sample_indices((1, 32, 16)), sample_indices((32, 16)))
    assert sample_seed((1, 32, 16)) == sample_seed((32, 16)) != sample_seed((16, 32))
    assert sample_indices((5, 3)).tolist() == list(range(15))  # small: every element


@pytest.mark.parametrize("defer", [False, True], ids=["cpu-path", "deferred-path"])
@pytest.mark.parametrize("length", [128, 600])
def test_position_norms_are_l2_per_position_binned_beyond_256(defer, length):
    from precguard import PositionNorms

    torch.manual_seed(0)
    x = torch.randn(2, length, 24)
    pos = PositionNorms(**evidence_of(x, defer=defer)["positions"])
    per = -(-length // POSITION_BINS)
    assert (pos.dim, pos.bin, pos.length) == (1, per, length)
    sq = x.double().square().sum((0, 2))
    sq = torch.nn.functional.pad(sq, (0, -length % per)).view(-1, per).sum(1)
    np.testing.assert_allclose(pos.array(), sq.sqrt().numpy(), rtol=1e-6)


def test_sequence_dim_rule():
    assert sequence_dim((2, 128, 64)) == 1  # (batch, seq, hidden)
    assert sequence_dim((2, 8, 128, 64)) == 2  # (batch, heads, seq, head_dim)
    assert sequence_dim((2, 1, 64)) is None  # one decoding step: no profile
    assert sequence_dim((128, 64)) is None  # a weight or flattened tokens: ambiguous


class LatePositions(nn.Module):
    """An output whose error (when ``fault``) grows with the position, as RoPE's does."""

    def __init__(self, fault: float) -> None:
        super().__init__()
        self.fault = fault

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.arange(x.shape[1], dtype=x.dtype).view(1, -1, 1)
        return x * (1 + self.fault * (t / x.shape[1]) ** 4)


def records_of(tmp_path, name: str, fault: float, x: torch.Tensor) -> dict:
    model = LatePositions(fault)
    with precguard.monitor(model, out=tmp_path / name):
        model(x)
    return {r.key: r for r in precguard.load_run(tmp_path / name).records()}


def test_statistics_only_pair_estimates_the_error_and_finds_late_positions(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 128, 64)
    g = records_of(tmp_path, "g", 0.0, x)["root.0.forward.output.0"]
    a = records_of(tmp_path, "a", 0.05, x)["root.0.forward.output.0"]
    m = stats_metrics(g, a, dtype="float32")
    out_g = x
    out_a = LatePositions(0.05)(x)
    true = float((out_a - out_g).double().norm() / out_g.double().norm())
    assert m.level == "stats" and m.sample_size == SAMPLE_SIZE
    # a lower bound, up to the float32 rounding of the recorded norms: each is off by a
    # few units of 2**-24 (its accumulation order is the CPU's SIMD width and threads'),
    # which moves pos_rel_l2 by up to ~1e-6 of itself here (seeds 0-5: 7.5e-7 measured)
    assert m.pos_rel_l2 is not None and m.pos_rel_l2 <= true + 8 * 2.0**-24
    assert m.pos_worst is not None and m.pos_worst >= 120  # the error's peak: the last positions
    assert m.sample_rel_l2 is not None and true / 3 < m.sample_rel_l2 < 3 * true
    assert m.error == max(m.sample_rel_l2, m.pos_rel_l2, m.stat_rel_diff["l2"])
    # the statistics alone understate it: what compare judged before samples existed
    assert max(m.stat_rel_diff.values()) < m.error


def test_equal_runs_show_no_error_and_older_records_fall_back_to_statistics(tmp_path):
    torch.manual_seed(0)
    x = torch.randn(2, 64, 32)
    g = records_of(tmp_path, "g", 0.0, x)["root.0.forward.output.0"]
    a = records_of(tmp_path, "a", 0.0, x)["root.0.forward.output.0"]
    m = stats_metrics(g, a, dtype="float32")
    assert (m.error, m.sample_rel_l2, m.pos_rel_l2) == (0.0, 0.0, 0.0)
    old = a.model_copy(update={"sample": None, "positions": None})
    m_old = stats_metrics(g, old, dtype="float32")
    assert m_old.sample_size is None and m_old.pos_worst is None
    assert m_old.error == max(m_old.stat_rel_diff.values())


def test_evidence_can_be_turned_off(tmp_path):
    model = LatePositions(0.0)
    with precguard.monitor(model, out=tmp_path / "r", evidence=False):
        model(torch.randn(2, 16, 8))
    rec = next(iter(precguard.load_run(tmp_path / "r").records()))
    assert rec.stats is not None and rec.sample is None and rec.positions is None


ROPE_BUG = "handwritten-llama-rope-bug"
ROTARY_OUT = "model.rotary_emb.0.forward.output.{}"


@pytest.fixture(scope="module")
def rope_runs(tmp_path_factory) -> tuple:
    """The README's flow on the RoPE bug: golden with every tensor, actual statistics only."""
    tmp = tmp_path_factory.mktemp("rope")
    golden = precguard.record_target(ROPE_BUG, device="cpu", out=tmp / "g", tensors=True)
    actual = precguard.record_target(ROPE_BUG, device="emu:bf16-mixed", out=tmp / "a")
    return golden, actual


def test_rope_bug_from_a_statistics_only_actual_shows_late_position_error(rope_runs):
    report = precguard.compare_runs(*rope_runs)
    by_key = {r.key: r for r in report.records}
    for index in (0, 1):  # cos and sin
        m = by_key[ROTARY_OUT.format(index)].metrics
        assert m is not None and m.level == "stats" and m.sample_size == SAMPLE_SIZE
        # positions are exact and one bf16 rounding explains 2**-8: the angles' error is
        # several times that, and it sits in the last positions (of 128)
        assert m.error > 3 * rounding_floor("bfloat16")
        assert m.pos_worst is not None and m.pos_worst >= 96
        assert m.sample_max_abs is not None and m.sample_max_abs > 0.03
    clean = by_key["model.layers.0.attn.q_proj.0.forward.output.0"].metrics
    assert clean is not None and clean.error < rounding_floor("bfloat16", 128)


def test_rope_bug_named_likely_from_a_statistics_only_actual(rope_runs):
    report = precguard.compare_runs(*rope_runs)
    assert report.verdict == "diverged"
    first = report.first_divergence
    assert first is not None and first.module == "model.rotary_emb"
    assert first.confidence == "statistics"
    assert first.settle_with == "model.rotary_emb.*"


def test_nonfinite_samples_are_left_out_of_the_estimate(tmp_path):
    g = torch.randn(4, 8, 8)
    a = g.clone()
    a.view(-1)[torch.from_numpy(sample_indices(tuple(g.shape))[:3])] = math.nan
    gm, am = nn.Identity(), nn.Identity()
    with precguard.monitor(gm, out=tmp_path / "g"):
        gm(g)
    with precguard.monitor(am, out=tmp_path / "a"):
        am(a)
    rg = {r.key: r for r in precguard.load_run(tmp_path / "g").records()}
    ra = {r.key: r for r in precguard.load_run(tmp_path / "a").records()}
    key = "root.0.forward.output.0"
    m = stats_metrics(rg[key], ra[key], dtype="float32")
    assert m.nan_mismatch == 3 and m.sample_size == SAMPLE_SIZE - 3 and m.sample_rel_l2 == 0.0


def test_a_causal_mask_in_fp16_statistics_only_matches(tmp_path):
    # tiny-llama's causal mask holds fp32's finfo.min on the golden and fp16's on the
    # actual: the statistics those stand-ins dominate (mean -inf against -3e4) say
    # nothing; both fills mask their keys outright (below numerics.MASK_FILL_MAX), so
    # the record is compared as a mask (compare/padding.py) and a clean fp16 run matches
    golden = precguard.record_target("tiny-llama", device="cpu", out=tmp_path / "g", tensors=True)
    actual = precguard.record_target("tiny-llama", device="emu:fp16", out=tmp_path / "a")
    report = precguard.compare_runs(golden, actual)
    assert report.verdict == "match", report.first_divergence
    mask = {r.key: r for r in report.records}["model.layers.0.0.forward.input.1"]
    assert mask.status == "pass"
    assert mask.metrics is not None and mask.metrics.error == 0.0  # the same keys masked
