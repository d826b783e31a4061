"""``assert_matches_golden``: a user's precision regression test, in process."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from precguard.compare import get_profile
from precguard.compare.sampled import sampled_bounds
from precguard.guard import session
from precguard.guard.margin import worst_margin
from precguard.testing import assert_matches_golden, default_loss
from tests.guard.models import batch, build


@pytest.fixture(autouse=True)
def _outside_the_session_summary(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests fail on purpose; keep them out of the suite's precision summary
    (which lists the project's real precision tests: test_regression_tiny_llama.py)."""
    monkeypatch.setattr(session, "current", lambda: None)


def _fault(model: torch.nn.Module, layer: int, factor: float) -> torch.nn.Module:
    model.layers[layer].gain = factor
    return model


def test_without_a_golden_the_test_fails_and_says_how_to_write_one(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match=r"no golden recording at .*--precguard-update-golden"):
        assert_matches_golden(build(), batch(), tmp_path / "golden", workdir=tmp_path / "w")


def test_the_unchanged_model_matches_its_golden_with_margin_zero(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    wrote = assert_matches_golden(build(), batch(), golden, update=True, workdir=tmp_path / "w1")
    assert wrote.action == "new" and wrote.comparison is None
    check = assert_matches_golden(build(), batch(), golden, workdir=tmp_path / "w2")
    assert check.action == "compared"
    assert check.comparison is not None and check.comparison.verdict == "match"
    assert check.worst is not None and check.worst.margin == 0.0  # same CPU, same numbers


def test_a_planted_tenth_of_a_percent_in_one_layer_fails_naming_that_layer(
    tmp_path: Path,
) -> None:
    golden = tmp_path / "golden"
    assert_matches_golden(build(), batch(), golden, update=True, workdir=tmp_path / "w1")
    with pytest.raises(AssertionError) as failed:
        assert_matches_golden(_fault(build(), 1, 1.001), batch(), golden, workdir=tmp_path / "w2")
    message = str(failed.value)
    assert "DIVERGED" in message
    assert "first divergence: layers.1 (Block)" in message
    assert "allowed" in message and "precision explains" in message
    report = tmp_path / "w2" / "report.html"
    assert f"HTML report: {report}" in message
    assert "<html" in report.read_text(encoding="utf-8").lower()[:200]


def test_a_golden_from_one_device_checks_a_run_on_another_at_the_lower_precision(
    tmp_path: Path,
) -> None:
    golden = tmp_path / "golden"
    assert_matches_golden(build(), batch(), golden, update=True, workdir=tmp_path / "w1")
    check = assert_matches_golden(
        build(), batch(), golden, device="emu:bf16", workdir=tmp_path / "w2"
    )
    assert check.comparison is not None
    assert check.comparison.devices == ["cpu", "emu:bf16"]
    worst = check.worst
    assert worst is not None and worst.dtype == "bfloat16"
    # bf16 rounding is visible, and well inside what bf16 allows
    assert 0 < worst.margin < 1


def test_a_model_whose_records_changed_fails_even_when_the_numbers_agree(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    assert_matches_golden(build(), batch(), golden, update=True, workdir=tmp_path / "w1")
    changed = build()
    changed.layers.append(torch.nn.Identity())  # same numbers, one more layer
    with pytest.raises(AssertionError, match=r"the model changed .*only in the run: layers\.3"):
        assert_matches_golden(changed, batch(), golden, workdir=tmp_path / "w2")


def test_train_records_gradients_and_leaves_the_model_as_it_was(tmp_path: Path) -> None:
    model = build()
    marker = torch.full_like(model.head.weight, 7.0)
    model.head.weight.grad = marker.clone()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    golden = tmp_path / "golden"
    assert_matches_golden(model, batch(), golden, train=True, update=True, workdir=tmp_path / "w")
    records = (golden / "rank0" / "records.jsonl").read_text()
    assert '"phase":"backward"' in records and '"role":"grad"' in records
    assert torch.equal(model.head.weight.grad, marker)
    assert model.layers[0].up.weight.grad is None
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())
    check = assert_matches_golden(model, batch(), golden, train=True, workdir=tmp_path / "w2")
    assert check.comparison is not None and "backward" in check.comparison.coverage.phases_compared


def test_a_dtype_runs_on_a_copy_and_the_users_model_stays_float32(tmp_path: Path) -> None:
    model = build()
    assert_matches_golden(
        model, batch(), tmp_path / "g", dtype="bfloat16", update=True, workdir=tmp_path / "w"
    )
    assert all(p.dtype == torch.float32 for p in model.parameters())
    manifest = (tmp_path / "g" / "manifest.json").read_text()
    assert '"dtype": "bfloat16"' in manifest


def test_the_default_loss_prefers_the_outputs_own_loss() -> None:
    class Out:
        loss = torch.tensor(3.0)
        logits = torch.ones(2)

    assert default_loss(Out()).item() == 3.0
    assert default_loss((torch.tensor([1, 2]), torch.tensor([2.0, 2.0]))).item() == 4.0
    with pytest.raises(TypeError, match="pass loss="):
        default_loss(torch.tensor([1, 2]))


def test_margins_are_error_over_the_records_own_allowed_error(tmp_path: Path) -> None:
    golden = tmp_path / "golden"
    assert_matches_golden(build(), batch(), golden, update=True, workdir=tmp_path / "w1")
    with pytest.raises(AssertionError):
        assert_matches_golden(_fault(build(), 2, 1.01), batch(), golden, workdir=tmp_path / "w2")
    import precguard

    result = precguard.compare_runs(golden, tmp_path / "w2" / "actual")
    worst = worst_margin(result)
    assert worst is not None and worst.allowed is not None
    record = next(r for r in result.records if r.key == worst.key)
    assert record.metrics is not None
    # the margin is the record's amplification over the judge's limit: the error the
    # judge holds it to over the allowed error, or its concentrated evidence (a slice, the
    # sample's largest elements) over what that allows, whichever is larger. A
    # statistics-only record is held to the lower bound of its sampled error (the
    # sample's own uncertainty, docs/compare.md "Sampling uncertainty"), full tensors to
    # their error
    assert record.amplification is not None
    limit = result.tolerances["amplification"]
    assert math.isclose(worst.margin, record.amplification / limit)
    (held, _), _ = sampled_bounds(record.metrics, get_profile(result.profile).bias_z)
    assert held <= record.metrics.error
    assert worst.margin >= held / worst.allowed * (1 - 1e-9)
    assert worst.margin > 1 and record.status == "fail"
    assert worst.module.startswith("layers.2") or worst.module in ("head", "root")


def test_a_report_that_cannot_be_written_still_fails_the_test_with_the_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    golden = tmp_path / "golden"
    assert_matches_golden(build(), batch(), golden, update=True, workdir=tmp_path / "w1")

    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("precguard.report.comparison.write_comparison_html", broken)
    with pytest.raises(
        AssertionError, match=r"(?s)first divergence: layers\.1 .*not written \(OSError"
    ):
        assert_matches_golden(_fault(build(), 1, 1.001), batch(), golden, workdir=tmp_path / "w2")


def test_the_sessions_device_runs_assertions_that_name_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``pytest --precguard-device emu:bf16``: the same test checks the port's device."""
    golden = tmp_path / "golden"
    assert_matches_golden(build(), batch(), golden, update=True, workdir=tmp_path / "w1")
    context = session.TestContext(nodeid="t", device="emu:bf16")
    monkeypatch.setattr(session, "current", lambda: context)
    check = assert_matches_golden(build(), batch(), golden, workdir=tmp_path / "w2")
    assert check.comparison is not None and check.comparison.devices == ["cpu", "emu:bf16"]
    assert context.properties[0][1]["verdict"] == "match"
