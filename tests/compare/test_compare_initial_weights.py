"""Two copies of the initial weights in one dtype are equal: a changed weight is named.

The story: a user ports a model and one expert's weights were converted wrongly
(3 % too large). Golden runs on the CPU in float32, the actual under an emulated
bf16 profile that keeps its weights in float32 too. Nothing computed the weights,
so the bf16 compute precision explains no difference in them.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precguard

WEIGHT = "model.layers.1.mlp.down_proj"


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return precguard.record_target("tiny-llama", out=tmp_path_factory.mktemp("g") / "run")


def _actual(tmp: Path, factor: float) -> Path:
    def plant(model: torch.nn.Module) -> None:
        with torch.no_grad():
            model.get_submodule(WEIGHT).weight[:4] *= factor

    return precguard.record_target("tiny-llama", device="emu:bf16", out=tmp, prepare=plant)


def test_a_weight_changed_by_3_percent_in_a_few_rows_is_named(golden: Path, tmp_path: Path):
    result = precguard.compare_runs(golden, _actual(tmp_path / "a", 1.03))
    assert result.verdict == "diverged"
    first = result.first_divergence
    assert first is not None and first.module == WEIGHT
    assert "weights, not its inputs, differ" in first.reason


def test_equal_weights_under_a_lower_compute_precision_pass(golden: Path, tmp_path: Path):
    result = precguard.compare_runs(golden, _actual(tmp_path / "a", 1.0))
    params = [r for r in result.records if r.role == "param"]
    assert params and all(r.status == "pass" for r in params)
    assert result.verdict == "match"
