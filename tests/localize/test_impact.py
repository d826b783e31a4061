"""Impact: which finding accounts for how much of the model's output error (issue 32).

The corpus (tests/localize/impact_corpus.py) is tiny-llama with attention sharp
enough for the rotary angles to reach the logits, run on ``emu:bf16-mixed``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import precguard
from precguard import BisectResult, comparison_sides, verify
from precguard.localize.impact import (
    bisect_findings,
    comparison_impact,
    error_budget,
    recordings_only,
)
from tests.localize.cli import precguard_cli
from tests.localize.impact_corpus import DEVICE, side

CORPUS = "tests/localize/impact_corpus.py:"


@pytest.fixture(scope="module")
def two_bugs_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("two-bugs")
    golden = precguard.record_target(
        CORPUS + "two_bugs", device="cpu", out=base / "cpu", tensors=True
    )
    actual = precguard.record_target(
        CORPUS + "two_bugs", device=DEVICE, out=base / "bf16", tensors=True
    )
    return golden, actual


def test_two_faults_are_ranked_by_their_share_of_the_output_error(two_bugs_runs) -> None:
    golden, actual = two_bugs_runs
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "diverged"
    golden, actual = comparison_sides(result, CORPUS + "two_bugs")
    measured = verify(result, actual, golden=golden, remedies=False)
    budget = measured.impact
    assert budget is not None and budget.measured == "target"
    ranked = [i.module for i in budget.impacts]
    # the rotary bug costs the logits far more than the wrong v_proj epilogue
    assert ranked[:2] == ["model.rotary_emb", "model.layers.1.self_attn.v_proj"]
    rotary, v_proj = budget.impacts[:2]
    assert rotary.share > 3 * v_proj.share > 0
    assert rotary.before == budget.output_error and rotary.after < rotary.before
    # both at reference together bring the output to the floor of a correct run
    assert budget.floor is not None and budget.together <= 1.01 * budget.floor
    assert 0 <= budget.unexplained <= 1
    # the re-run reproduces the recorded actual side: the same output error, bit for bit
    assert budget.recorded_output_error == budget.output_error
    payload = json.loads(measured.model_dump_json())
    row = payload["impact"]["impacts"][0]
    assert {"before", "after", "share"} <= set(row) and row["module"] == "model.rotary_emb"


def test_a_planted_projection_fault_outranks_the_casts_rounding() -> None:
    budget = error_budget(
        side("projection_bug"),
        [("model.rotary_emb", "suspect"), ("model.layers.1.self_attn.v_proj", "first divergence")],
    )
    assert budget.impacts[0].module == "model.layers.1.self_attn.v_proj"
    assert budget.impacts[0].share > budget.impacts[1].share


def test_hf_rounded_inv_freq_is_a_small_share_of_a_correct_bf16_run() -> None:
    """HF's LlamaForCausalLM cast with .to(bfloat16) rounds inv_freq: real, but a small share."""
    clean = side("clean")
    assert str(clean.model.model.rotary_emb.inv_freq.dtype) == "torch.bfloat16"
    budget = error_budget(clean, [("model.rotary_emb", "suspect")])
    (rotary,) = budget.impacts
    assert 0 < rotary.share < 0.25
    assert "with it at reference precision" in rotary.describe()


def test_without_a_target_the_budget_says_what_the_recordings_allow(two_bugs_runs) -> None:
    result = precguard.compare_runs(*two_bugs_runs)
    budget = recordings_only(result, reason="no --target was given")
    assert budget.measured == "recordings" and "needs --target" in budget.note
    assert all(i.share is None for i in budget.impacts)
    assert {i.module for i in budget.impacts} >= {"model.rotary_emb"}


def test_recordings_of_two_targets_are_not_re_run_from_one(two_bugs_runs) -> None:
    # a golden recorded from one target and an actual from another: a re-run from either
    # builds both sides alike and would read "output not affected" for what the two differ by
    result = precguard.compare_runs(*two_bugs_runs)
    recorded = result.targets[0]
    assert recorded is not None and result.targets == [recorded, recorded]
    budget = comparison_impact(result, CORPUS + "two_bugs")
    assert budget.measured == "target"  # one target: re-run
    elsewhere = result.model_copy(update={"targets": [recorded, "two_faults.py"]})
    budget = comparison_impact(elsewhere, CORPUS + "two_bugs")
    assert budget.measured == "recordings" and "two targets" in budget.note
    # the same file named from another directory is one target
    moved = result.model_copy(update={"targets": [recorded, "/x/impact_corpus.py:two_bugs"]})
    assert comparison_impact(moved, CORPUS + "two_bugs").measured == "target"


@pytest.mark.slow
def test_compare_without_target_says_impact_needs_one(two_bugs_runs) -> None:
    golden, actual = two_bugs_runs
    out = precguard_cli("compare", str(golden), str(actual))
    assert out.returncode == 1
    assert "impact needs --target" in out.stdout
    bad = precguard_cli("compare", str(golden), str(actual), "--verify")
    assert bad.returncode == 2 and "--verify" in bad.stderr and "--target" in bad.stderr


def test_bisects_culprits_get_their_impact() -> None:
    culprits = BisectResult(
        target="sharp-llama-rope-bug",
        device=DEVICE,
        dtype="bfloat16",
        reference="cpu",
        reference_dtype="float32",
        metric="rel_l2",
        threshold=0.1,
        culprits=["model.rotary_emb"],
        probes=[],
        probe_count=0,
        units=1,
        baseline_error=0.0,
        fixed_error=0.0,
    )
    budget = error_budget(side("rope_bug"), bisect_findings(culprits))
    (rotary,) = budget.impacts
    assert rotary.found_by == ["bisect"] and rotary.share > 0.3


def test_a_target_that_cannot_be_rerun_leaves_the_comparison_standing(two_bugs_runs) -> None:
    result = precguard.compare_runs(*two_bugs_runs)
    golden, actual = comparison_sides(result, "tests/localize/impact_corpus.py:no_such_target")
    measured = verify(result, actual, golden=golden, remedies=False)
    assert measured.verdict == "diverged" and measured.first_divergence == result.first_divergence
    assert measured.impact is not None and "impact not measured" in measured.impact.note
