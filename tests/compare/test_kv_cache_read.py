"""The KV cache a module reads is named in the why line when it differs (issue 28 item 7).

A tiny HF LLaMA decodes a prefill and two steps with a ``DynamicCache``, recorded
with ``kv_cache=True``. On the actual side the cache is kept in float16 (every
layer's keys and values cast after each attention writes them): each later step's
attention reads rounded keys and values, so its output differs by ~2e-4 while its
inputs match. Before, the why line said only "its inputs match (error 0) but its
output does not" — nothing a user could act on. Now it names the cache (layer,
keys or values, error, the dtype it was stored in) and the remedy.
"""

from __future__ import annotations

import pytest
import torch

import precguard
from precguard.compare.caches import cache_entry
from precguard.targets import build_tiny_llama

pytest.importorskip("transformers")


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_tiny_llama(num_hidden_layers=2).eval()


def _keep_cache_in_fp16(model: torch.nn.Module) -> None:
    def hook(module, args, kwargs, output):
        for layer in kwargs["cache"].layers:
            if getattr(layer, "keys", None) is not None and layer.keys.dtype != torch.float16:
                layer.keys, layer.values = layer.keys.half(), layer.values.half()

    for layer in model.model.layers:
        layer.self_attn.register_forward_hook(hook, with_kwargs=True)


def _corrupt_layer1_values(model: torch.nn.Module) -> None:
    def hook(module, args, kwargs, output):
        kwargs["cache"].layers[1].values.mul_(1.02)

    model.model.layers[1].self_attn.register_forward_hook(hook, with_kwargs=True)


def _decode(model: torch.nn.Module, out, tensors: bool) -> None:
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with precguard.monitor(model, out, kv_cache=True, tensors=tensors), torch.no_grad():
        result = model(ids, use_cache=True)
        for _ in range(2):
            token = result.logits[:, -1:].argmax(-1)
            result = model(token, cache=result.past_key_values, use_cache=True)


@pytest.mark.parametrize("tensors", [True, False], ids=["full", "statistics"])
def test_an_attention_reading_a_cache_kept_in_fp16_names_the_cache_and_the_remedy(
    tmp_path, tensors
):
    _decode(_llama(), tmp_path / "golden", tensors)
    actual = _llama()
    _keep_cache_in_fp16(actual)
    _decode(actual, tmp_path / "actual", tensors)
    result = precguard.compare_runs(tmp_path / "golden", tmp_path / "actual")
    fd = result.first_divergence
    assert result.verdict == "diverged" and fd is not None
    # step 0 attends to the keys and values it computed; step 1 is the first to read them
    assert (fd.module, fd.step) == ("model.layers.0.self_attn", 1)
    assert "its inputs match (error 0) but the KV cache it reads does not: layer 0 " in fd.reason
    assert "stored as float16 where golden has float32" in fd.reason
    assert "keep the KV cache in the model's dtype (float32)" in fd.reason


def test_the_same_under_hf_generate(tmp_path):
    """``generate()`` drives the cache itself: one recorded step per call, the same line."""
    ids = torch.randint(0, 256, (1, 12), generator=torch.Generator().manual_seed(1))
    for side in ("golden", "actual"):
        model = _llama()
        if side == "actual":
            _keep_cache_in_fp16(model)
        with precguard.monitor(model, tmp_path / side, kv_cache=True), torch.no_grad():
            model.generate(ids, max_new_tokens=2, do_sample=False)
    fd = precguard.compare_runs(tmp_path / "golden", tmp_path / "actual").first_divergence
    assert fd is not None and (fd.module, fd.step) == ("model.layers.0.self_attn", 1)
    assert "the KV cache it reads does not: layer 0 " in fd.reason
    assert "keep the KV cache in the model's dtype (float32)" in fd.reason


def test_a_cache_written_wrong_is_said_to_be_the_cache_it_wrote(tmp_path):
    _decode(_llama(), tmp_path / "golden", True)
    faulty = _llama()
    _corrupt_layer1_values(faulty)
    _decode(faulty, tmp_path / "actual", True)
    fd = precguard.compare_runs(tmp_path / "golden", tmp_path / "actual").first_divergence
    assert fd is not None and (fd.module, fd.step) == ("model.layers.1.self_attn", 0)
    assert "that record is the KV cache it wrote (layer 1 values)" in fd.reason
    assert "keep the KV cache" not in fd.reason  # its dtype is golden's: no cast to undo


def test_cache_names_are_told_from_other_names():
    assert cache_entry("kwargs.cache.layers.1.values") == (1, "values")
    assert cache_entry("kwargs.past_key_values.layers.0.keys") == (0, "keys")
    assert cache_entry("output.past_key_values.self_attention_cache.layers.3.keys") == (3, "keys")
    assert cache_entry("args.3.layers.2.values") == (2, "values")
    assert cache_entry("kwargs.hidden_states") is None
    assert cache_entry("output.1.0") is None
    assert cache_entry("weight") is None
