"""Activation checkpointing: the forward autograd runs again in backward is recognised
as recomputation, not recorded as a second call (issue 28 item 6).

Before, the recomputed forward was recorded as ``call 1`` records (the
non-reentrant flavour stops it early, leaving inputs without outputs), and a
golden without checkpointing against an actual with it matched with "54
missing" and no word of recomputation.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.checkpoint import checkpoint

import precguard
from precguard.targets import build_tiny_llama

transformers = pytest.importorskip("transformers")


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_tiny_llama(num_hidden_layers=2).train()


def _checkpoint_mlps(model: torch.nn.Module, *, reentrant: bool) -> None:
    for layer in model.model.layers:
        forward = layer.mlp.forward
        layer.mlp.forward = lambda x, forward=forward: checkpoint(
            forward, x, use_reentrant=reentrant
        )


CHECKPOINTING = {
    "hf": lambda m: m.gradient_checkpointing_enable(),
    "reentrant": lambda m: _checkpoint_mlps(m, reentrant=True),
    "non-reentrant": lambda m: _checkpoint_mlps(m, reentrant=False),
}


def _train_step(model: torch.nn.Module) -> list[torch.Tensor]:
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    model(ids, labels=ids).loss.backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("how", list(CHECKPOINTING))
def test_golden_without_checkpointing_matches_actual_with_it_and_says_it_recomputed(tmp_path, how):
    golden = _llama()
    with precguard.monitor(golden, tmp_path / "golden"):
        _train_step(golden)

    plain = _llama()
    CHECKPOINTING[how](plain)
    expected = _train_step(plain)
    actual = _llama()
    CHECKPOINTING[how](actual)
    with precguard.monitor(actual, tmp_path / "actual"):
        grads = _train_step(actual)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected, strict=True))  # bitwise

    run = precguard.load_run(tmp_path / "actual")
    assert {r.call for r in run.records(0)} == {0}  # no second call recorded
    recomputed = run.manifest.recomputed_calls
    assert recomputed > 0

    result = precguard.compare_runs(tmp_path / "golden", tmp_path / "actual")
    assert result.verdict == "match", result.first_divergence
    assert result.counts.missing == 0
    assert f"the actual recomputed {recomputed} module call(s) during backward" in " ".join(
        result.warnings
    )
    # the gradients that flowed through the recomputed graph are compared too
    assert any(r.phase == "backward" and r.module.endswith("mlp.down_proj") for r in result.records)


def test_recomputations_stopped_early_are_not_kept_from_step_to_step(tmp_path):
    """Non-reentrant checkpointing stops a recomputation once it has what backward needs,
    so some recomputed calls never reach their post-hook. Their open frames (holding the
    recomputed inputs) used to pile up, one per step and module."""
    model = _llama()
    CHECKPOINTING["hf"](model)
    with precguard.monitor(model, tmp_path / "run") as handle:
        open_frames = []
        for _ in range(3):
            _train_step(model)
            open_frames.append(sum(len(site.frames) for site in handle.monitor._site_of.values()))
    assert open_frames[0] > 0  # the last backward's, dropped at the next forward
    assert open_frames == [open_frames[0]] * 3
