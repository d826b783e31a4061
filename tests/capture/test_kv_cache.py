"""A KV cache's tensors are recorded with ``kv_cache=True``, at the module call that
wrote them, so a fault planted in the cache is named (issue 28 item 4).

transformers 5.24 passes the cache as ``cache=`` (``past_key_values`` is its old,
deprecated name) and returns it as ``past_key_values``. Without the option the
cache (a ``DynamicCache``, not a container capture walks) was
never recorded: a cache written wrong showed only a step later, as an
attention whose inputs match and whose output does not.
"""

from __future__ import annotations

import pytest
import torch

import precguard
from precguard.targets import build_tiny_llama

transformers = pytest.importorskip("transformers")


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_tiny_llama(num_hidden_layers=2).eval()


def _corrupt_layer1_values(model: torch.nn.Module) -> None:
    """A cache fault: layer 1's attention stores its values 2 % too large."""

    def hook(module, args, kwargs, output):
        kwargs["cache"].layers[1].values.mul_(1.02)

    model.model.layers[1].self_attn.register_forward_hook(hook, with_kwargs=True)


def _decode(model: torch.nn.Module, out, **options) -> torch.Tensor:
    """A prefill and two decoding steps with a KV cache, recorded (one step per call)."""
    ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
    with precguard.monitor(model, out, **options), torch.no_grad():
        result = model(ids, use_cache=True)
        cache = result.past_key_values
        logits = [result.logits]
        for _ in range(2):
            token = result.logits[:, -1:].argmax(-1)
            result = model(token, cache=cache, use_cache=True)
            logits.append(result.logits)
    return torch.cat(logits, dim=1)


def test_cache_tensors_are_recorded_at_the_attention_that_wrote_them(tmp_path):
    plain_model = _llama()
    with torch.no_grad():
        ids = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(1))
        plain = plain_model(ids, use_cache=True).logits
    logits = _decode(_llama(), tmp_path / "run", kv_cache=True)
    assert torch.equal(logits[:, :12], plain)  # bitwise
    records = precguard.load_run(tmp_path / "run").records(0)
    cache = [r for r in records if ".layers." in r.name]
    # each layer's keys and values, once per step, at its self_attn, as outputs
    assert {(r.module, r.name, r.role) for r in cache if r.step == 0} == {
        (f"model.layers.{i}.self_attn", f"kwargs.cache.layers.{i}.{kv}", "output")
        for i in (0, 1)
        for kv in ("keys", "values")
    }
    assert len(cache) == 3 * 4
    step2 = [r for r in cache if r.step == 2]
    assert all(r.shape[2] == 14 for r in step2)  # the whole layer: 12 + 2 positions


def test_a_fault_planted_in_the_cache_is_named_where_it_was_written(tmp_path):
    _decode(_llama(), tmp_path / "golden", kv_cache=True)
    faulty = _llama()
    _corrupt_layer1_values(faulty)
    _decode(faulty, tmp_path / "actual", kv_cache=True)
    result = precguard.compare_runs(tmp_path / "golden", tmp_path / "actual")
    fd = result.first_divergence
    assert result.verdict == "diverged"
    assert fd is not None and fd.step == 0
    assert fd.module == "model.layers.1.self_attn"
    named = {r.key: r for r in precguard.load_run(tmp_path / "actual").records(0)}
    assert named[fd.key].name == "kwargs.cache.layers.1.values"


def test_without_the_option_no_cache_tensor_is_recorded(tmp_path):
    _decode(_llama(), tmp_path / "run")
    records = precguard.load_run(tmp_path / "run").records(0)
    assert not [r for r in records if ".layers." in r.name]
