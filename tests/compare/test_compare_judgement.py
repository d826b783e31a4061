"""How compare judges a record and a module call: compute precision, the scale bias,
the expected error, backward calls, statistics-only honesty (issue 8)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precguard
from precguard import UsageError, load_run
from precguard.compare import Metrics, RecordResult
from precguard.compare.expected import rounding_floor
from precguard.compare.metrics import full_metrics, precision, tolerance_dtype
from precguard.compare.tolerance import get_profile, judge, with_bias
from precguard.compare.verdict import StepVerdict, judge_unit
from tests.compare.conftest import FAULTS, record, run_cli
from tests.compare.synthetic import full_record

BF16 = get_profile("default").for_dtype("bfloat16")


def _bf16(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).to(torch.float32)


def _judged(g: torch.Tensor, a: torch.Tensor) -> Metrics:
    m = full_metrics(g, a, dtype="bfloat16", rtol=BF16.rtol, atol=BF16.atol)
    return with_bias(m, get_profile("default"))


# -- precision and the tolerance dtype ----------------------------------------------------


def test_each_side_is_as_precise_as_the_less_precise_of_stored_and_computed() -> None:
    assert precision("float32", "bfloat16") == "bfloat16"  # emu:bf16 stores float32
    assert precision("bfloat16", None) == "bfloat16"
    assert precision("float16", "bfloat16") == "bfloat16"
    assert precision("int64", "bfloat16") == "int64"
    assert tolerance_dtype("float32", "bfloat16") == "bfloat16"
    assert tolerance_dtype("float32", "bfloat16", "golden") == "float32"
    assert tolerance_dtype("float32", "float32", "float16") == "float16"


def test_an_unknown_tolerance_dtype_is_a_usage_error(tiny_golden: Path) -> None:
    with pytest.raises(UsageError, match="--tolerance-dtype"):
        precguard.compare_runs(tiny_golden, tiny_golden, tolerance_dtype="bf17")


def test_emu_bf16_run_stored_as_float32_is_judged_as_bf16(
    tiny_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    actual = record(tmp_path / "emu", device="emu:bf16")
    run = load_run(actual)
    assert run.manifest.compute_dtype == "bfloat16"
    assert {r.dtype for r in run.records() if r.role == "output" and r.stats} == {"float32"}

    result = precguard.compare_runs(tiny_golden, actual)
    held = precguard.compare_runs(tiny_golden, actual, tolerance_dtype="golden")

    assert result.compute_dtypes == [None, "bfloat16"]
    floats = [r for r in result.records if r.metrics and r.metrics.level == "full"]
    assert floats and {r.metrics.dtype for r in floats} == {"bfloat16"}
    assert result.verdict == "match"
    assert held.verdict == "diverged"  # the override still holds it to fp32
    as_fp16 = precguard.compare_runs(tiny_golden, actual, tolerance_dtype="fp16")
    assert {r.metrics.dtype for r in as_fp16.records if r.metrics.level == "full"} == {"float16"}
    code, out, _ = run_cli(["compare", str(tiny_golden), str(actual)], capsys)
    assert code == 0 and "matches within bfloat16 precision" in out


# -- the scale bias -----------------------------------------------------------------------


def test_a_1pct_scale_hides_in_bf16_noise_element_wise_but_not_in_aggregate() -> None:
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(64, 64, generator=gen)

    rounded = _judged(g, _bf16(g))
    scaled = _judged(g, _bf16(g * 1.01))

    assert rounded.error < BF16.rel_l2 and scaled.error < BF16.rel_l2  # both within rel_l2
    assert not rounded.bias and judge(rounded, get_profile("default")) == "pass"
    assert scaled.bias and judge(scaled, get_profile("default")) == "fail"
    assert scaled.scale == pytest.approx(1.01, abs=4 * scaled.scale_se)
    assert scaled.mean_rel_err == pytest.approx(0.01, abs=1e-3)
    assert abs(rounded.scale - 1) < 4 * rounded.scale_se + 2**-8


def test_a_scale_error_per_row_is_noise_not_bias() -> None:
    # a normalization's per-row scale rounded to bf16: every row off by up to one ulp,
    # in random directions; the cluster-robust standard error must see rows, not elements
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(64, 64, generator=gen)
    row_scale = 1 + 2**-8 * (2 * torch.rand(64, 1, generator=gen) - 1)

    m = _judged(g, g * row_scale)

    assert not m.bias
    assert m.scale_se > 2**-8 / 64  # wider than independent elements would make it


def test_rtol_override_raises_the_bias_floor_too() -> None:
    gen = torch.Generator().manual_seed(2)
    g = torch.randn(4096, generator=gen)
    loose = get_profile("default").with_overrides(rtol=2e-2, atol=None)
    m = full_metrics(g, g * 1.01, dtype="float32", rtol=2e-2, atol=1e-5)
    assert with_bias(m, get_profile("default")).bias
    assert not with_bias(m, loose).bias


def test_the_rounding_floor_is_the_compute_dtypes_not_fp32s() -> None:
    assert rounding_floor("bfloat16") == 2.0**-8
    assert rounding_floor("float32") == 2.0**-24
    # dot products of length K add ~sqrt(K) fp32 roundoffs (Higham & Mary)
    assert rounding_floor("float32", 64) == pytest.approx(2.0**-24 * 9)
    assert rounding_floor("bfloat16", 64) == pytest.approx(2.0**-8 + 8 * 2.0**-24)


# -- synthetic calls: forward and backward classified alike ---------------------------------


def _rec(key: str, seq: int, error: float, *, scale: float = 1.0, bias: bool = False):
    """A record of a ``Block`` judged by the default profile's tolerance."""
    r = full_record(key, seq, error, shape=(4, 64), module_type="Block", scale=scale, bias=bias)
    return r.model_copy(update={"status": judge(r.metrics, get_profile("default"))})


def _decided(results: list[RecordResult]) -> StepVerdict:
    """``compare``'s one pass over records ``_rec`` judged by the tolerance already: under a
    fixed profile their statuses stand, and each call is decided (the default's amplification)."""
    return judge_unit(results, get_profile("fixed"))


def _record(verdict: StepVerdict, key: str) -> RecordResult:
    return next(r for r in verdict.results if r.key == key)


def test_a_backward_call_that_makes_its_input_gradient_wrong_is_local() -> None:
    results = [
        _rec("blk.0.forward.input.0", 0, 0.0),
        _rec("blk.0.forward.output.0", 1, 0.0),
        _rec("blk.0.backward.output.0", 2, 1e-7),  # incoming gradient: fine
        _rec("blk.0.backward.input.0", 3, 1e-2),  # the gradient it computed: not
    ]

    (cand,) = _decided(results).candidates

    assert cand.result.module == "blk" and cand.result.phase == "backward"
    assert cand.local is True and cand.expected_error is not None
    assert "the gradients it computed" in cand.reason


def test_a_backward_call_that_passes_gradient_error_on_is_not_local() -> None:
    results = [
        _rec("blk.0.forward.input.0", 0, 0.0),
        _rec("blk.0.backward.output.0", 2, 1e-2),
        _rec("blk.0.backward.input.0", 3, 1.2e-2),
    ]
    verdict = _decided(results)

    assert verdict.candidates == []
    decided = _record(verdict, "blk.0.backward.input.0")
    assert decided.status == "fail"
    assert decided.local is False and decided.expected_error == pytest.approx(1e-2)
    assert decided.amplification is not None and decided.amplification < 2


def test_a_1pct_scaled_gradient_is_local_by_its_bias() -> None:
    results = [
        _rec("blk.0.backward.output.0", 2, 1e-7),
        _rec("blk.0.backward.input.0", 3, 1e-2, scale=1.01, bias=True),
    ]
    (cand,) = _decided(results).candidates
    assert cand.local is True and cand.result.phase == "backward"


def test_backward_without_input_gradients_stays_undecided_and_says_why() -> None:
    # recordings from before gradients w.r.t. module inputs were captured
    results = [
        _rec("blk.0.backward.output.0", 2, 1e-7),
        _rec("blk.0.backward.grad.0", 3, 1e-2),
    ]
    verdict = _decided(results)

    assert verdict.candidates == []
    undecided = _record(verdict, "blk.0.backward.grad.0")
    assert undecided.status == "fail"
    assert (undecided.local, undecided.amplification, undecided.expected_error) == (None,) * 3
    first = verdict.fallback
    assert first is not None and first.local is None
    assert "no gradients w.r.t. module inputs" in first.reason


def test_suspects_name_every_module_with_its_own_error() -> None:
    results = [
        _rec("a.0.forward.input.0", 0, 0.0),
        _rec("a.0.forward.output.0", 1, 1e-2),
        _rec("b.0.forward.input.0", 2, 1e-2),
        _rec("b.0.forward.output.0", 3, 1.1e-2, scale=1.01, bias=True),
        _rec("c.0.forward.input.0", 4, 1.1e-2),
        _rec("c.0.forward.output.0", 5, 1.2e-2),  # only passes it on
    ]
    cands = _decided(results).candidates
    assert [c.result.module for c in cands] == ["a", "b"]


# -- statistics only: say how sure, and how to settle it -------------------------------------


def test_stats_only_verdict_states_its_confidence_and_the_glob_that_settles_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fault = next(f for f in FAULTS if f.name == "output-drift-0.1pct")
    golden = record(tmp_path / "g", tensors=False)
    actual = record(tmp_path / "a", fault=fault, tensors=False)

    result = precguard.compare_runs(golden, actual)
    code, out, _ = run_cli(["compare", str(golden), str(actual)], capsys)

    fd = result.first_divergence
    assert fd is not None and fd.module == fault.module
    assert fd.confidence == "statistics"
    assert fd.settle_with == f"{fault.module}.*"
    assert code == 1
    flat = " ".join(out.split())
    assert "likely: this module made the error (statistics only" in flat
    assert "yes: this module made the error" not in flat
    assert f"--tensors '{fault.module}.*'" in flat


def test_a_parent_is_explained_by_its_child_in_the_same_phase_only() -> None:
    results = [
        _rec("blk.0.forward.input.0", 0, 0.0),
        _rec("blk.inner.0.forward.input.0", 1, 0.0),
        _rec("blk.inner.0.forward.output.0", 2, 1e-2),
        _rec("blk.0.forward.output.0", 3, 1e-2),
        _rec("blk.0.backward.output.0", 4, 1e-7),
        _rec("blk.0.backward.input.0", 5, 1e-2),
    ]
    cands = _decided(results).candidates
    assert [(c.result.module, c.result.phase) for c in cands] == [
        ("blk.inner", "forward"),
        ("blk", "backward"),
    ]
