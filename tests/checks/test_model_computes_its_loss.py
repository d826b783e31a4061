"""The checklist on a model that computes its own loss and returns ``(loss, logits)``.

The story: a user's GPT-NeoX-style decoder takes ``labels`` and returns HF's
``return_dict=False`` tuple. The loss checks must read the logits (not the
loss, which comes first), run without error on the correct model, and judge
the loss the model computes itself, on its own logits, against fp64.
"""

from __future__ import annotations

from pathlib import Path

import torch

from precguard.checks._lab import logits_of, loss_of

PARALLEL = Path(__file__).with_name("parallel.py")


def parallel(name: str) -> str:
    return f"{PARALLEL}:{name}"


def test_outputs_are_read_as_hf_returns_them():
    from transformers.modeling_outputs import CausalLMOutput

    loss, logits = torch.tensor(2.5), torch.randn(2, 3, 7)
    for output in [(loss, logits), [loss, logits], {"loss": loss, "logits": logits}]:
        assert logits_of(output) is logits
        assert loss_of(output) is loss
    hf = CausalLMOutput(loss=loss, logits=logits)
    assert logits_of(hf) is logits and loss_of(hf) is loss
    # no labels: (logits,) holds no loss
    assert loss_of((logits,)) is None and logits_of((logits,)) is logits


def test_correct_twin_has_no_loss_error_on_mixed_bf16(run_check):
    run = run_check("--target", parallel("correct"), "--device", "emu:bf16-mixed", "--only", "loss")
    assert run.statuses("error") == [] and run.statuses("fail") == [], run.out
    assert run.code == 0
    ce = run.finding("loss.cross_entropy")
    own = ce["evidence"]["cases"]["model_loss"]
    # the model's loss is F.cross_entropy on float32 logits: fp32's error, fp32's tolerance
    assert own["labels"] == "shifted" and own["float32_ops_computed_in"] == "float32"
    assert own["rel_error"] <= own["tolerance"] < 1e-5


def test_a_loss_computed_on_bf16_logits_fails(run_check):
    run = run_check(
        "--target", parallel("loss_low_precision"), "--device", "emu:bf16-mixed",
        "--only", "loss.cross_entropy",
    )  # fmt: skip
    ce = run.finding("loss.cross_entropy")
    assert ce["status"] == "fail", ce
    assert "the loss the model computes in forward" in ce["summary"]
    assert ce["evidence"]["failing"] == ["model_loss"]
    assert run.code == 1
