"""A loss computed on bf16 logits is named by compare, full tensors and statistics alike.

The user story: a model cast to bfloat16 (``emu:bf16-mixed``: fp32 islands the code
asks for are kept) computes its cross-entropy by hand on the bf16 logits; its twin
upcasts them first. The loss *value* cannot tell them apart (a mean over tokens of
per-token rounding, then one bf16 rounding of the scalar: the bug's value is no
further from golden than the twin's); the precision the loss was computed in can,
and the record keeps it.
"""

from __future__ import annotations

import pytest

import precguard
from precguard.compare.loss import REMEDY
from tests.compare.parallel_small import small_target

LOSS = "loss_fn.0.forward.output.0"


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    return precguard.record_target(
        small_target(), device="cpu", out=tmp_path_factory.mktemp("loss") / "g", tensors=True
    )


@pytest.mark.parametrize("tensors", [True, False], ids=["full", "stats-only"])
def test_a_loss_computed_on_bf16_logits_is_the_first_divergence(golden, tmp_path, tensors):
    actual = precguard.record_target(
        small_target("loss_low_precision"),
        device="emu:bf16-mixed",
        out=tmp_path / "a",
        tensors=tensors,
    )
    result = precguard.compare_runs(golden, actual)
    fd = result.first_divergence
    assert result.verdict == "diverged" and fd is not None
    assert fd.module == "loss_fn" and fd.key == LOSS and fd.local
    assert "computes the loss in bfloat16" in fd.reason and REMEDY in fd.reason
    # its value is within what bf16 explains: the finding is the precision, not a size
    assert fd.metrics.error < 2.0**-8


@pytest.mark.parametrize("tensors", [True, False], ids=["full", "stats-only"])
def test_the_twin_that_upcasts_its_logits_matches(golden, tmp_path, tensors):
    actual = precguard.record_target(
        small_target(), device="emu:bf16-mixed", out=tmp_path / "a", tensors=tensors
    )
    result = precguard.compare_runs(golden, actual)
    loss = next(r for r in result.records if r.key == LOSS)
    assert loss.actual_dtype == "float32"
    assert result.verdict == "match", [r.key for r in result.records if r.status != "pass"]


def test_a_model_cast_to_bf16_on_emu_bf16_shows_it_too(golden, tmp_path):
    """``--dtype bfloat16`` on emu:bf16: the bug's loss is a bf16 tensor, the twin's float32;
    their values are equally far from golden."""
    runs = {
        bug: precguard.record_target(
            small_target(bug), device="emu:bf16", dtype="bfloat16", out=tmp_path / str(bug)
        )
        for bug in (None, "loss_low_precision")
    }
    twin, bug = (precguard.compare_runs(golden, runs[b]) for b in runs)
    assert twin.verdict == "match"
    assert bug.verdict == "diverged" and bug.first_divergence.module == "loss_fn"
    errors = [next(r for r in c.records if r.key == LOSS).metrics.error for c in (twin, bug)]
    assert errors[0] == pytest.approx(errors[1])


def test_on_emu_bf16_the_bug_and_its_twin_are_one_computation(tmp_path):
    """emu:bf16 rounds every op to bf16, the twin's float32 log-softmax too, and keeps
    float32 tensors: nothing tells the two apart there, and compare says match."""
    runs = {
        bug: precguard.record_target(
            small_target(bug), device="emu:bf16", out=tmp_path / str(bug), tensors=True
        )
        for bug in (None, "loss_low_precision")
    }
    loss = {
        bug: next(r for r in precguard.load_run(path).records() if r.key == LOSS)
        for bug, path in runs.items()
    }
    assert loss[None].dtype == loss["loss_low_precision"].dtype == "float32"
    assert loss[None].stats.mean == loss["loss_low_precision"].stats.mean
    assert precguard.compare_runs(runs[None], runs["loss_low_precision"]).verdict == "match"
