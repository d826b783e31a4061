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

transformers = pytest.importorskip("transformers")


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_implementation="eager",
    )
    return transformers.LlamaForCausalLM(config).train()


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
