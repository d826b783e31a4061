"""The ``ops.graph_dtypes`` check: which ops of a forward ran below the reference's precision."""

from __future__ import annotations

import torch
from transformers.models.llama import modeling_llama

import precguard

_EAGER = modeling_llama.eager_attention_forward


def _softmax_in_the_input_dtype(module, query, key, value, attention_mask, scaling, **kwargs):
    # a port that drops HF's dtype=torch.float32: softmax runs in the model's dtype
    key = modeling_llama.repeat_kv(key, module.num_key_value_groups)
    value = modeling_llama.repeat_kv(value, module.num_key_value_groups)
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling + attention_mask
    weights = torch.softmax(weights, dim=-1)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


def _graph_dtypes(dtype):
    d = precguard.check("llama-inference", "tiny-llama", dtype=dtype, only=["ops.graph_dtypes"])
    (found,) = d.findings
    return found


def test_a_bf16_model_runs_its_matmuls_in_bf16_and_keeps_softmax_and_norms_in_fp32():
    found = _graph_dtypes("bfloat16")
    assert found.status == "pass", found.summary
    below = found.evidence["ops_below_reference"]
    ops = {(e["module"], e["op"]) for e in below}
    assert any(m.endswith("self_attn.q_proj") and op == "linear" for m, op in ops)
    assert any(m.endswith("self_attn") and op == "matmul" for m, op in ops)
    assert found.evidence["count"] > len(below) // 2
    assert not any(e["sensitive"] for e in below)


def test_a_softmax_run_in_bf16_is_listed_with_its_module(monkeypatch):
    monkeypatch.setattr(modeling_llama, "eager_attention_forward", _softmax_in_the_input_dtype)
    found = _graph_dtypes("bfloat16")
    assert found.status == "warn", found.summary
    first = found.evidence["ops_below_reference"][0]
    assert first["op"] == "softmax" and first["sensitive"]
    assert first["module"].endswith("self_attn") and first["device_dtype"] == "bfloat16"
    assert "softmax" in found.summary


def test_a_float32_run_has_no_op_below_the_reference():
    assert _graph_dtypes(None).evidence["count"] == 0


def test_autocast_ops_lists_the_ops_autocast_ran_below_the_reference():
    d = precguard.check(
        "llama-finetune", "tiny-llama", device="emu:bf16-mixed", only=["amp.autocast_ops"]
    )
    (found,) = d.findings
    below = found.evidence["ops_below_reference"]
    ran_low = {(e["module"].rsplit(".", 1)[-1], e["op"]) for e in below if e["what"] == "ran in"}
    assert ("self_attn", "matmul") in ran_low and ("q_proj", "linear") in ran_low
    # autocast keeps softmax in fp32: not listed as run lower
    assert not any(e["op"] == "softmax" and e["what"] == "ran in" for e in below)


def test_the_checks_share_one_forward_per_side(forward_passes):
    # amp.autocast_ops and ops.graph_dtypes both diff the device's op graph against the
    # reference's (issue 41: checks share the runs they need). The reference's and the
    # device's plain forwards are each run once, traced, and the device's forward under
    # autocast once, watched and traced together: three forward passes, not five
    d = precguard.check(
        "llama-finetune",
        "tiny-llama",
        dtype="bfloat16",
        only=["amp.autocast_ops", "ops.graph_dtypes"],
    )
    assert sorted(f.id for f in d.findings) == ["amp.autocast_ops", "ops.graph_dtypes"]
    assert all(f.status != "error" for f in d.findings), [f.summary for f in d.findings]
    assert forward_passes("LlamaForCausalLM") == 3
