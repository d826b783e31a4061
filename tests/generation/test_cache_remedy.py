"""A KV-cache finding's remedy, the cache kept in the model's dtype, verified by decoding
again (issue 32): the fp16 cache of the corpus's second decoder in a bf16 model."""

from __future__ import annotations

from pathlib import Path

import torch

from precguard import load_target
from precguard.generation.cache_remedy import verify_cache_remedy
from precguard.generation.decode import DecodeSide, decode
from precguard.localize.impact import FLOOR_SLACK
from precguard.targets import parallel_decoder_batch as lm_batch


def _sides(actual: str) -> tuple[DecodeSide, DecodeSide, torch.Tensor, list[int]]:
    golden = DecodeSide.build(load_target("parallel-decoder-step"), "cpu")
    prompt = lm_batch(0)["input_ids"][:1, :16]
    tokens = decode(golden, prompt, 4, cache_free=False).chosen
    return golden, DecodeSide.build(load_target(actual), "cpu", "bfloat16"), prompt, tokens


def test_an_fp16_cache_kept_in_the_models_dtype_decodes_within_the_floor() -> None:
    golden, actual, prompt, tokens = _sides("parallel-decoder-cache-fp16")
    check = verify_cache_remedy(golden, actual, prompt, tokens, where="layers.0.values")
    # the sink's massive value overflows in the fp16 cache: the decoding is not finite
    assert check.before == float("inf") and check.verdict == "verified"
    assert check.after <= FLOOR_SLACK * check.floor
    assert "cache kept in the model's dtype (layers.0.values) (bfloat16)" in check.summary
    # the remedy is a context: the model itself still keeps its cache in fp16
    _, cache = actual.step_fn()(prompt, None)
    assert cache[0][1].dtype == torch.float16


def test_a_cache_in_the_models_dtype_already_says_there_is_nothing_to_keep() -> None:
    golden, actual, prompt, tokens = _sides("parallel-decoder-step")
    check = verify_cache_remedy(golden, actual, prompt, tokens)
    assert check.verdict == "did not help" and "nothing to keep" in check.note
    assert check.after == check.before


def test_generate_diff_verify_applies_the_caches_remedy_to_its_kv_cache_cause(
    tmp_path: Path,
) -> None:
    from precguard import generate_diff
    from precguard.generation.page import write_html

    result = generate_diff(
        "parallel-decoder-cache-fp16",
        reference_target="parallel-decoder-step",
        device="cpu",
        dtype="bfloat16",
        prompts=[lm_batch(0)["input_ids"][0, :16].tolist()],
        max_new_tokens=4,
        layerwise=False,
        verify=True,
    )
    assert result.cause is not None and result.cause.kind == "kv-cache"
    (check,) = result.remedies
    assert check.remedy == "cache-model-dtype" and check.verdict == "verified"
    assert '"remedies"' in result.model_dump_json()
    page = tmp_path / "g.html"
    write_html(result, page)
    assert "the KV cache kept in the model&#x27;s dtype" in page.read_text()
