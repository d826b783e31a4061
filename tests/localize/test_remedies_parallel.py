"""Remedies verified on the second decoder's bugs (issue 32 item 4): the norm in bf16,
the loss on bf16 logits, and op-check's finding carried to its impact.

The corpus's second decoder (``parallel-decoder-*``, models/parallel_decoder.py) run
in real bfloat16 on the CPU; its correct twin (``parallel-decoder``) gives the floor.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest
from torch import nn

from precguard import Side, op_check
from precguard.localize.impact import FLOOR_SLACK, ActualSide, error_budget
from precguard.localize.verify import verify, verify_remedies
from tests.localize.cli import precguard_cli


@functools.cache
def _side(name: str) -> ActualSide:
    return ActualSide.open(Side(name, "cpu", "bfloat16"))


def _norms(side: ActualSide) -> list[str]:
    return [
        n
        for n, m in side.model.named_modules()
        if isinstance(m, nn.Module) and "Norm" in type(m).__name__
    ]


@pytest.fixture(scope="module")
def clean_floor() -> float:
    """The correct twin's output error in bfloat16: a correct run."""
    return _side("parallel-decoder").output_error()


def test_of_every_norm_in_bf16_the_final_one_costs_the_logits_and_float32_statistics_fix_it(
    clean_floor,
) -> None:
    side = _side("parallel-decoder-norm-low-precision")
    norms = _norms(side)
    assert len(norms) == 7  # two per block, and the final one
    budget = verify_remedies(side, error_budget(side, [(n, "first divergence") for n in norms]))
    first = budget.impacts[0]
    # the final norm feeds the tied head: its cancelled statistics reach the logits
    assert first.module == "transformer.ln_f" and first.share > 0.3
    assert all(i.share < 0.1 for i in budget.impacts[1:])
    stats = {r.remedy: r for r in first.remedies}["float32-compute"]
    assert "statistics in float32" in stats.summary and stats.verdict == "verified"
    assert stats.after <= FLOOR_SLACK * clean_floor < stats.before
    # a block's norm is rescued by the next residual add: its fix cannot help, and says so
    block = {r.remedy: r for r in budget.impacts[1].remedies}["float32-compute"]
    assert block.verdict == "did not help"


def test_the_loss_on_float32_logits_is_verified_on_the_loss_the_logits_do_not_show() -> None:
    side = _side("parallel-decoder-loss-low-precision")
    budget = verify_remedies(side, error_budget(side, [("loss_fn", "suspect")]))
    (loss,) = budget.impacts
    # the loss does not move the logits: its share of their error is nothing
    assert loss.share is not None and abs(loss.share) < 0.01
    (check,) = loss.remedies
    assert check.remedy == "float32-loss" and check.verdict == "verified"
    assert check.after <= FLOOR_SLACK * check.floor < check.before


def test_a_correct_loss_says_its_remedy_cannot_help() -> None:
    side = _side("parallel-decoder")
    (loss,) = verify_remedies(side, error_budget(side, [("loss_fn", "suspect")])).impacts
    (check,) = loss.remedies
    # within the floor already: not needed (never "did not help", which reads as a failed fix)
    assert check.verdict == "not needed"
    assert "is within the floor of a correct run" in check.describe()


def test_an_op_check_finding_gets_its_impact_and_a_verified_remedy(clean_floor) -> None:
    side = Side("parallel-decoder-norm-low-precision", "cpu", "bfloat16")
    result = op_check(side=side, module="transformer.ln_f", seq_lens=[32])
    assert result.exit_code == 1  # the sweep fails it at a large mean
    budget = verify(result, side)
    (impact,) = budget.impacts
    assert impact.module == "transformer.ln_f" and impact.found_by == ["op-check"]
    assert impact.share > 0.3
    stats = {r.remedy: r for r in impact.remedies}["float32-compute"]
    assert stats.verdict == "verified" and stats.after <= FLOOR_SLACK * clean_floor


def test_an_op_check_that_passes_has_nothing_to_measure() -> None:
    side = Side("parallel-decoder", "cpu", "bfloat16")
    result = op_check(side=side, module="transformer.ln_f", seq_lens=[32])
    assert result.exit_code == 0
    budget = verify(result, side)
    assert budget.impacts == [] and "nothing to measure" in budget.note


def test_findings_that_miss_the_real_fault_say_the_fault_may_lie_elsewhere() -> None:
    """compare names the blocks' norms of the norm bug; the final norm, which costs the
    logits, is not among them: the budget must not clear the bug as within the floor."""
    side = _side("parallel-decoder-norm-low-precision")
    blocks = [n for n in _norms(side) if n != "transformer.ln_f"]
    budget = error_budget(side, [(n, "suspect") for n in blocks])
    assert "its cause is a module no finding names" in budget.note
    # and with the final norm among the findings the note is gone
    assert "no finding names" not in error_budget(side, [("transformer.ln_f", "x")]).note


def test_the_checklists_loss_finding_goes_to_the_loss_module_a_model_computes_itself() -> None:
    from precguard.checks import Finding

    finding = Finding(
        id="loss.cross_entropy",
        status="fail",
        summary="the loss differs from a float32 cross-entropy",
        evidence={"rel_error": 1e-3},
    )
    budget = verify([finding], Side("parallel-decoder-loss-low-precision", "cpu", "bfloat16"))
    (loss,) = budget.impacts
    assert loss.module == "loss_fn" and loss.found_by == ["loss.cross_entropy"]
    (check,) = loss.remedies
    assert check.remedy == "float32-loss" and check.verdict == "verified"


@pytest.mark.slow
def test_op_check_verify_prints_and_writes_the_modules_impact(tmp_path: Path) -> None:
    out = precguard_cli(
        *("op-check", "-d", "cpu", "--dtype", "bfloat16"),
        *("-t", "parallel-decoder-norm-low-precision", "-m", "transformer.ln_f"),
        *("--seq-lens", "32", "--verify", "--json", str(tmp_path / "o.json")),
    )
    assert out.returncode == 1, out.stderr
    said = " ".join(out.stdout.split())  # wrapped at the terminal's width, never cut
    assert "transformer.ln_f: compute the norm's statistics in float32: verified" in said
    assert f"wrote {tmp_path / 'o.json'}" in out.stderr
    impact = json.loads((tmp_path / "o.json").read_text())["impact"]
    assert impact["impacts"][0]["found_by"] == ["op-check"]


def test_a_loss_finding_that_names_no_module_goes_to_the_models_own_loss_module() -> None:
    """compare may name the loss by the target's loss function, not a module: the model
    computes it in ``loss_fn``, whose remedy is the one verified."""
    side = _side("parallel-decoder-loss-low-precision")
    budget = verify_remedies(side, error_budget(side, []), loss=True)
    (loss,) = budget.impacts
    assert loss.module == "loss_fn" and loss.remedies[0].verdict == "verified"
