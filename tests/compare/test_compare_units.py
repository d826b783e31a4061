"""Metrics, alignment, tolerances and report details, on small hand-made inputs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import precguard
from precguard import Record, Stats
from precguard.compare.align import align
from precguard.compare.metrics import exact_metrics, full_metrics, stats_metrics
from precguard.compare.tolerance import get_profile, judge
from tests.compare.conftest import FAULTS, record, run_cli


def test_identical_tensors_have_zero_error() -> None:
    g = torch.randn(1000)
    m = full_metrics(g, g.clone(), dtype="float32", rtol=1.3e-6, atol=1e-5)
    assert m.error == 0 and m.max_abs_err == 0 and m.max_ulp == 0
    assert m.cosine == pytest.approx(1.0)
    assert judge(m, get_profile("default")) == "pass"


def test_metrics_of_a_known_drift() -> None:
    g = torch.linspace(1.0, 2.0, 10_000, dtype=torch.float64)
    a = g * 1.001
    m = full_metrics(g, a, dtype="float64", rtol=1e-7, atol=1e-7)
    assert m.rel_l2 == pytest.approx(1e-3, rel=1e-6)
    assert m.max_rel_err == pytest.approx(1e-3, rel=1e-6)
    assert m.max_abs_err == pytest.approx(2e-3, rel=1e-6)
    assert m.rel_err_share == {"1e-2": 0.0, "1e-3": pytest.approx(0.0, abs=1e-3), "1e-4": 1.0}
    assert m.close_share == 1.0
    assert judge(m, get_profile("default")) == "fail"


def test_chunked_equals_whole() -> None:
    gen = torch.Generator().manual_seed(0)
    g = torch.randn(100_003, generator=gen)
    a = g + 1e-4 * torch.randn(100_003, generator=gen)
    whole = full_metrics(g, a, dtype="float32", rtol=1e-3, atol=1e-5, chunk=1 << 20)
    chunked = full_metrics(g, a, dtype="float32", rtol=1e-3, atol=1e-5, chunk=1000)
    for field in ("max_abs_err", "max_ulp", "close_share", "rel_err_share"):
        assert getattr(chunked, field) == getattr(whole, field)
    # every reduction accumulates in fp64: chunking changes only fp64 rounding
    for field in ("rel_l2", "rmse", "mean_abs_err", "max_rel_err", "scale", "scale_se"):
        assert getattr(chunked, field) == pytest.approx(getattr(whole, field), rel=1e-12, abs=0)
    assert chunked.mean_rel_err == pytest.approx(whole.mean_rel_err, rel=1e-9, abs=1e-15)
    assert 1 - chunked.cosine == pytest.approx(1 - whole.cosine, rel=1e-6)
    assert chunked.cosine == pytest.approx(whole.cosine, rel=1e-12, abs=0)


def test_cosine_of_float32_tensors_is_exact_to_fp64() -> None:
    # float32 dot products made a whole tensor's cosine 1.0 and its chunks' 0.9999999985
    gen = torch.Generator().manual_seed(3)
    g = torch.randn(1_000_003, generator=gen)
    a = g * (1 + 1e-7 * torch.randn(1_000_003, generator=gen))
    exact = torch.nn.functional.cosine_similarity(g.double(), a.double(), dim=0).item()

    for chunk in (1 << 20, 4096, 777):
        m = full_metrics(g, a, dtype="float32", rtol=1.3e-6, atol=1e-5, chunk=chunk)
        assert m.cosine == pytest.approx(exact, rel=1e-12, abs=0)


def test_threaded_chunks_equal_one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = torch.Generator().manual_seed(1)
    g = torch.randn(50_001, generator=gen)
    a = g + 1e-4 * torch.randn(50_001, generator=gen)
    a[7] = float("nan")
    released: list[tuple[int, int]] = []

    def run(threads: str) -> dict:
        monkeypatch.setenv("PRECGUARD_COMPARE_THREADS", threads)
        m = full_metrics(
            g, a, dtype="float32", rtol=1e-3, atol=1e-5, chunk=1000,
            release=lambda s, e: released.append((s, e)),
        )  # fmt: skip
        return m.model_dump()

    one = run("1")
    released.clear()
    four = run("4")

    assert four == one  # chunks are merged in order: the sums are bit for bit the same
    assert four["nan_mismatch"] == 1
    # every chunk was handed back exactly once
    assert sorted(released) == [(s, min(s + 1000, 50_001)) for s in range(0, 50_001, 1000)]


def test_ulps_are_counted_in_the_actual_dtype() -> None:
    g = torch.tensor([1.0, 2.0, -3.0, 0.5])
    a = g.to(torch.bfloat16)
    a_bits = a.view(torch.int16).clone()
    a_bits[1] += 3  # three bf16 steps away
    a = a_bits.view(torch.bfloat16)
    m = full_metrics(g, a, dtype="float32", rtol=1.3e-6, atol=1e-5)
    assert m.max_ulp == 3


def test_nan_and_inf_mismatches_are_counted() -> None:
    g = torch.tensor([1.0, 2.0, float("inf"), 4.0, float("nan")])
    a = torch.tensor([1.0, float("nan"), float("inf"), float("-inf"), float("nan")])
    m = full_metrics(g, a, dtype="float32", rtol=1.3e-6, atol=1e-5)
    assert m.nan_mismatch == 1 and m.inf_mismatch == 1
    assert judge(m, get_profile("default")) == "nonfinite"
    assert math.isfinite(m.error)


def test_strict_profile_fails_one_element_that_default_averages_away() -> None:
    g = torch.ones(10_000)
    a = g.clone()
    a[0] += 1e-4  # one element 1e-4 off: rel_l2 1e-6, under fp32's rtol 1.3e-6
    m = full_metrics(g, a, dtype="float32", rtol=1.3e-6, atol=1e-5)
    assert m.rel_l2 == pytest.approx(1e-6, rel=1e-2)
    assert m.close_share == pytest.approx(1e-4)
    assert judge(m, get_profile("default")) == "pass"
    assert judge(m, get_profile("strict")) == "fail"


def test_exact_metrics_for_integer_tensors() -> None:
    m = exact_metrics(torch.tensor([1, 2, 3]), torch.tensor([1, 5, 3]))
    assert m.level == "exact" and m.mismatched == 1
    assert judge(m, get_profile("default")) == "fail"


def _stats(**kw: float) -> Stats:
    base = dict(min=-1.0, max=1.0, mean=0.0, std=0.5, absmax=1.0, l2=10.0, nan=0, inf=0,
                zeros=0, numel=100)  # fmt: skip
    base.update(kw)
    return Stats(**base)


def _rec(key: str, seq: int, *, shape=(2, 3), dtype="float32", stats=None, module=None) -> Record:
    module_name, call, phase, role, index = key.rsplit(".", 4)
    return Record(
        key=key, module=module or module_name, module_type="Linear", call=int(call),
        phase=phase, role=role, index=int(index), step=0, rank=0, seq=seq, dtype=dtype,
        shape=list(shape), stats=stats,
    )  # fmt: skip


def test_stats_metrics_judge_against_the_tensor_scale() -> None:
    g = _rec("m.0.forward.output.0", 0, stats=_stats())
    a = _rec("m.0.forward.output.0", 0, stats=_stats(mean=1e-4, l2=10.01))
    m = stats_metrics(g, a, dtype="float32")
    assert m.level == "stats"
    # mean is judged against rms = l2 / sqrt(numel) = 1, not against |mean| = 0
    assert m.stat_rel_diff["mean"] == pytest.approx(1e-4)
    assert m.stat_rel_diff["l2"] == pytest.approx(1e-3)
    assert m.error == pytest.approx(1e-3)
    assert "weaker" in (m.note or "")


def test_alignment_pairs_renamed_modules_by_order_and_lists_leftovers() -> None:
    golden = [
        _rec("net.fc1.0.forward.output.0", 0),
        _rec("net.act.0.forward.output.0", 1),
        _rec("net.fc2.0.forward.output.0", 2, shape=(2, 5)),
        _rec("net.fc2.1.forward.output.0", 3, shape=(2, 5)),
    ]
    actual = [
        _rec("net.fc1.0.forward.output.0", 0),
        _rec("net.activation.0.forward.output.0", 1),  # renamed
        _rec("net.fc2.0.forward.output.0", 2, shape=(2, 5)),
        _rec("net.extra.0.forward.output.0", 3, shape=(9,)),  # no partner of that shape
    ]
    result = align(golden, actual)
    pairs = {g.key: a.key for g, a in result.pairs}
    assert pairs["net.act.0.forward.output.0"] == "net.activation.0.forward.output.0"
    assert [r.key for r in result.golden_only] == ["net.fc2.1.forward.output.0"]
    assert [r.key for r in result.actual_only] == ["net.extra.0.forward.output.0"]


def test_alignment_prefers_same_dtype_among_same_shape() -> None:
    golden = [_rec("p.a.0.forward.output.0", 0, dtype="bfloat16")]
    actual = [
        _rec("p.b.0.forward.output.0", 0, dtype="float32"),
        _rec("p.c.0.forward.output.0", 1, dtype="bfloat16"),
    ]
    result = align(golden, actual)
    assert result.pairs[0][1].key == "p.c.0.forward.output.0"


@pytest.fixture(scope="module")
def rmsnorm_fault(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("rms")
    fault = FAULTS[0]
    return record(base / "g"), record(base / "a", fault=fault)


def test_msprobe_profile_misses_the_fp16_rmsnorm_that_default_catches(rmsnorm_fault) -> None:
    golden, actual = rmsnorm_fault
    assert precguard.compare_runs(golden, actual).verdict == "diverged"
    assert precguard.compare_runs(golden, actual, profile="msprobe").verdict == "match"


def test_rtol_override_loosens_every_dtype(rmsnorm_fault) -> None:
    golden, actual = rmsnorm_fault
    loose = precguard.compare_runs(golden, actual, rtol=1e-2)
    assert loose.verdict == "match"
    assert loose.profile == "default+custom"
    default = get_profile("default")
    assert set(loose.tolerances) == {*default.dtypes, "amplification"}
    for name, tol in default.dtypes.items():
        applied = loose.tolerances[name]
        assert applied["rtol"] == 1e-2
        assert applied["atol"] == tol.atol  # --atol not given: unchanged
        # rel_l2 and the stats tolerance keep their ratio to rtol (k x rtol)
        assert applied["rel_l2"] == pytest.approx(1e-2 * tol.rel_l2 / tol.rtol)
        assert applied["stats_rtol"] == pytest.approx(1e-2 * tol.stats_rtol / tol.rtol)


def test_fingerprint_diff_is_reported(rmsnorm_fault, tmp_path: Path) -> None:
    import shutil

    golden, actual = rmsnorm_fault
    changed = tmp_path / "changed"
    shutil.copytree(actual, changed)
    manifest = json.loads((changed / "manifest.json").read_text())
    manifest["fingerprint"]["torch.float32_matmul_precision"] = "medium"
    manifest["fingerprint"]["env.NVIDIA_TF32_OVERRIDE"] = "0"
    (changed / "manifest.json").write_text(json.dumps(manifest))

    result = precguard.compare_runs(golden, changed)

    assert result.fingerprint_diff["torch.float32_matmul_precision"] == ["highest", "medium"]
    assert result.fingerprint_diff["env.NVIDIA_TF32_OVERRIDE"] == [None, "0"]


def test_json_report_has_the_documented_shape(rmsnorm_fault, tmp_path: Path, capsys) -> None:
    golden, actual = rmsnorm_fault
    out = tmp_path / "r.json"
    code, _, _ = run_cli(["compare", str(golden), str(actual), "--json", str(out)], capsys)
    assert code == 1
    data = json.loads(out.read_text())
    assert data["schema_version"] == 1
    assert {"golden", "actual", "verdict", "first_divergence", "records", "unmatched"} <= set(data)
    fd = data["first_divergence"]
    assert {"key", "module", "module_type", "step", "rank", "metrics", "local", "reason"} <= set(fd)
    assert fd["module"] == "model.layers.0.input_layernorm"
    assert fd["module_type"] == "LlamaRMSNorm"
    assert set(data["unmatched"]) == {"golden_only", "actual_only"}
    assert {"key", "module", "status", "metrics"} <= set(data["records"][0])
    assert "fingerprint_diff" in data


def test_step_filter_and_multi_step_runs(tmp_path: Path) -> None:
    fault = next(f for f in FAULTS if f.name == "output-drift-0.1pct")
    golden = record(tmp_path / "g", steps=2, tensors=False)
    actual = record(tmp_path / "a", steps=2, tensors=False, fault=fault)

    both = precguard.compare_runs(golden, actual)
    step1 = precguard.compare_runs(golden, actual, step=1)

    assert {r.step for r in both.records} == {0, 1}
    assert both.first_divergence is not None and both.first_divergence.step == 0
    assert {r.step for r in step1.records} == {1}
    assert step1.first_divergence is not None and step1.first_divergence.step == 1
    assert step1.first_divergence.module == fault.module


def test_training_step_gradients_are_compared(tmp_path: Path) -> None:
    golden = record(tmp_path / "g", train=True, tensors=False)
    actual = record(tmp_path / "a", train=True, tensors=False)
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "match"
    assert any(r.phase == "backward" for r in result.records)


def test_compare_runs_is_the_function_and_compare_the_subpackage(rmsnorm_fault) -> None:
    """One name, one thing: no module made callable to stand in for the function."""
    import types

    import precguard.compare as subpackage

    assert precguard.compare is subpackage
    assert isinstance(subpackage, types.ModuleType) and not callable(subpackage)
    assert type(subpackage) is types.ModuleType  # no module-class swap
    # the public function is layout's (it gathers a parallel side, then runs compare's one
    # job); the subpackage's compare_runs is the same comparison without layout= and says
    # so when given one (issue 38: the layout is a strategy, not installed into compare)
    assert precguard.compare_runs.__module__ == "precguard.layout.compare"
    assert subpackage.compare_runs(*rmsnorm_fault).verdict == "diverged"
    assert precguard.compare_runs(*rmsnorm_fault).verdict == "diverged"
    assert subpackage.compare_recordings(*rmsnorm_fault) == precguard.compare_runs(*rmsnorm_fault)


def _nan_in_one_element(model: torch.nn.Module) -> None:
    def hook(_m, _args, out):
        out = out.clone()
        out[0, 0, 0] = float("nan")
        return out

    model.get_submodule("model.layers.2.mlp.act_fn").register_forward_hook(hook)


def test_nan_introduced_by_one_module_is_named(tiny_golden: Path, tmp_path: Path) -> None:
    actual = precguard.record_target(
        "tiny-llama", out=tmp_path / "nan", tensors=True, prepare=_nan_in_one_element
    )
    result = precguard.compare_runs(tiny_golden, actual)
    fd = result.first_divergence
    assert result.verdict == "diverged"
    assert fd is not None and fd.module == "model.layers.2.mlp.act_fn"
    assert fd.metrics.nan_mismatch == 1
    assert "NaN/Inf" in fd.reason
    assert result.counts.nonfinite > 0


def _as_rank(src: Path, dst: Path, rank: int) -> None:
    """Copy rank0/ of ``src`` into ``dst``/rank{rank}/, rewriting each record's rank."""
    import shutil

    out = dst / f"rank{rank}"
    shutil.copytree(src / "rank0", out)
    lines = (out / "records.jsonl").read_text().splitlines()
    records = [json.loads(line) | {"rank": rank} for line in lines]
    (out / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_ranks_are_compared_separately_and_named(tiny_golden: Path, tmp_path: Path) -> None:
    import shutil

    fault = next(f for f in FAULTS if f.name == "rope-fp16")
    faulty = record(tmp_path / "faulty", fault=fault)
    golden, actual = tmp_path / "g2", tmp_path / "a2"
    shutil.copytree(tiny_golden, golden)
    _as_rank(tiny_golden, golden, 1)
    shutil.copytree(tiny_golden, actual)
    _as_rank(faulty, actual, 1)  # only rank 1 carries the fault

    result = precguard.compare_runs(golden, actual)
    rank0 = precguard.compare_runs(golden, actual, rank=0)

    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    assert result.first_divergence.rank == 1
    assert result.first_divergence.module == fault.module
    assert {r.rank for r in result.records} == {0, 1}
    assert rank0.verdict == "match"


@pytest.mark.parametrize("tensors", [True, False], ids=["full-tensors", "stats-only"])
def test_activation_shape_mismatch_fails_the_record(tmp_path: Path, tensors: bool) -> None:
    """A port whose layer keeps another width (same weights): the record fails, not compared
    on a part."""

    class Keep(torch.nn.Module):
        def __init__(self, width: int) -> None:
            super().__init__()
            self.width = width

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x[:, : self.width]

    for name, width in (("golden", 3), ("actual", 4)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(5, 5), Keep(width))
        with precguard.monitor(model, out=tmp_path / name, tensors=tensors), torch.no_grad():
            model(torch.ones(2, 5))
    result = precguard.compare_runs(tmp_path / "golden", tmp_path / "actual")
    [record] = [r for r in result.records if r.key == "1.0.forward.output.0"]
    assert record.status == "fail" and record.metrics is not None
    assert record.metrics.level == "none" and "shapes differ" in (record.metrics.note or "")
    assert result.verdict == "diverged"


def test_different_input_data_is_reported_as_such(tiny_golden: Path, tmp_path: Path) -> None:
    from precguard.targets import lm_batch, tiny_llama

    other_data = tiny_llama()
    other_data.batch = lambda step: lm_batch(step, seed=1)
    actual = precguard.record_target(other_data, out=tmp_path / "data", tensors=True)

    result = precguard.compare_runs(tiny_golden, actual)

    fd = result.first_divergence
    assert fd is not None and fd.local is False
    assert fd.module == "root" and "different data" in fd.reason


def test_every_failing_output_is_classified_local_or_propagated(
    tiny_golden: Path, tmp_path: Path
) -> None:
    fault = next(f for f in FAULTS if f.name == "output-drift-0.1pct")
    actual = record(tmp_path / "drift", fault=fault)

    result = precguard.compare_runs(tiny_golden, actual)

    failing = {
        r.module: r
        for r in result.records
        if r.status == "fail" and r.role == "output" and r.phase == "forward"
    }
    assert all(r.local is not None and r.amplification is not None for r in failing.values())
    assert failing[fault.module].local is True
    assert failing[fault.module].amplification > 1000
    # downstream modules carry the error on, and what they consumed explains it: they pass
    # (the fixed tolerance once failed them as "propagated")
    downstream = {
        r.module: r for r in result.records if r.role == "output" and r.phase == "forward"
    }
    for name in ("model.layers.2.mlp", "lm_head"):
        r = downstream[name]
        assert r.status == "pass" and r.metrics is not None and r.expected_error is not None
        assert r.metrics.error > 1e-4 and r.expected_error >= r.metrics.error / 10


def test_comparison_json_round_trips_with_non_finite_numbers(rmsnorm_fault) -> None:
    from precguard.compare import Comparison

    result = precguard.compare_runs(*rmsnorm_fault)
    again = Comparison.model_validate_json(result.model_dump_json())
    assert again == result


def _scale_mlp_input_grad(model: torch.nn.Module) -> None:
    mlp = model.get_submodule("model.layers.2.mlp")
    mlp.register_full_backward_hook(lambda _m, grad_in, _out: tuple(g * 1.01 for g in grad_in))


def test_backward_only_divergence_is_named_and_classified(tmp_path: Path) -> None:
    golden = record(tmp_path / "g", train=True, tensors=False)
    actual = precguard.record_target(
        "tiny-llama", out=tmp_path / "a", train=True, prepare=_scale_mlp_input_grad
    )

    result = precguard.compare_runs(golden, actual)

    fd = result.first_divergence
    assert result.verdict == "diverged"
    assert fd is not None and fd.phase == "backward" and fd.local is True
    # the MLP's output gradients match; the input gradient it computes does not
    assert fd.module == "model.layers.2.mlp"
    assert fd.key == "model.layers.2.mlp.0.backward.input.0"
    assert all(r.status == "pass" for r in result.records if r.phase == "forward")


def test_fp32_ulps_same_sign_and_across_zero() -> None:
    g = torch.tensor([1.0, -2.0, 3.0])
    a = g.clone()
    a[0] = torch.nextafter(torch.nextafter(a[0], torch.tensor(2.0)), torch.tensor(2.0))
    assert full_metrics(g, a, dtype="float32", rtol=1.3e-6, atol=1e-5).max_ulp == 2
    tiny = torch.tensor([1e-45, 5.0])  # the smallest subnormal, one step above +0
    flipped = torch.tensor([-1e-45, 5.0])
    # +tiny to -tiny: one step down to +0, (-0 counts as the same value), one more to -tiny
    assert full_metrics(tiny, flipped, dtype="float32", rtol=1.3e-6, atol=1e-5).max_ulp == 2


def test_tensor_store_releaser_does_not_need_the_tensor_read_first(tiny_golden: Path) -> None:
    from precguard import load_run
    from precguard.dump.tensors import TensorStore

    run = load_run(tiny_golden)
    rec = next(r for r in run.records(0) if r.tensor is not None and r.dtype == "float32")
    store = TensorStore(run.path)
    try:
        release = store.releaser(rec, itemsize=4)  # before any store.tensor(rec)
        before = store.tensor(rec).clone()
        release(0, before.numel())
        # pages given back are read again from the file: the values do not change
        assert torch.equal(store.tensor(rec), before)
        assert torch.equal(before, run.tensor(rec))
    finally:
        store.close()
