"""compare on op-level recordings: a fault in an attention module's own code is named by its op."""

from __future__ import annotations

import torch
from transformers.models.llama import modeling_llama

import precguard

_EAGER = modeling_llama.eager_attention_forward


def _attention_with_wrong_scale(module, query, key, value, attention_mask, scaling, **kwargs):
    # the planted fault: a port that rounds the softmax scale badly (1% off), in the
    # attention module's own code between q_proj/k_proj and o_proj
    return _EAGER(module, query, key, value, attention_mask, scaling * 1.01, **kwargs)


def _record(model, ids, out, level):
    with torch.no_grad(), precguard.monitor(model, out=out, level=level, backward=False):
        model(ids)


def test_compare_names_the_op_inside_attention_that_made_the_error(
    tiny_llama, input_ids, tmp_path, monkeypatch
):
    _record(tiny_llama, input_ids, tmp_path / "golden", "both")
    monkeypatch.setattr(modeling_llama, "eager_attention_forward", _attention_with_wrong_scale)
    _record(tiny_llama, input_ids, tmp_path / "actual", "both")

    result = precguard.compare_runs(tmp_path / "golden", tmp_path / "actual")
    first = result.first_divergence
    assert result.verdict == "diverged" and first is not None
    # q @ k^T (matmul.0) still matches; the product with the scale (the 5th mul of the
    # attention, after RoPE's four) is where the error starts
    assert first.module == "model.layers.0.self_attn.op.mul"
    assert first.key == "model.layers.0.self_attn.op.mul.4.forward.output.0"
    assert first.local is True
    assert first.module_type == "Tensor.mul"


def test_module_level_recordings_only_name_the_attention(
    tiny_llama, input_ids, tmp_path, monkeypatch
):
    # the same fault without op records: compare can only name the module
    _record(tiny_llama, input_ids, tmp_path / "golden", "module")
    monkeypatch.setattr(modeling_llama, "eager_attention_forward", _attention_with_wrong_scale)
    _record(tiny_llama, input_ids, tmp_path / "actual", "module")
    first = precguard.compare_runs(tmp_path / "golden", tmp_path / "actual").first_divergence
    assert first is not None and first.module == "model.layers.0.self_attn"
