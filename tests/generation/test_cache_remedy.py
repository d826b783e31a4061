"""A KV-cache finding's remedy, the cache kept in the model's dtype, verified by decoding
again (issue 32): the fp16 cache of the corpus's second decoder in a bf16 model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from precguard import load_target
from precguard.generation.cache_remedy import cache_in_model_dtype, verify_cache_remedy
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
    assert check.verdict in ("did not help", "not needed") and "nothing to keep" in check.note
    assert check.after == check.before


def test_generate_diff_verify_applies_the_caches_remedy_to_its_kv_cache_cause(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from precguard import GenerationDiff
    from precguard.cli import main

    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"input_ids": lm_batch(0)["input_ids"][0, :16].tolist()}))
    report, page = tmp_path / "g.json", tmp_path / "g.html"
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "generate-diff",
                "--target", "parallel-decoder-cache-fp16",
                "--reference-target", "parallel-decoder-step",
                "--device", "cpu", "--dtype", "bfloat16",
                "--prompts", str(prompts), "--max-new-tokens", "4",
                "--no-layerwise", "--verify",
                "--json", str(report), "--html", str(page),
            ]
        )  # fmt: skip
    err = capsys.readouterr().err
    assert exited.value.code == 1, err  # the tokens part: a finding, not an error
    assert '"remedies"' in report.read_text(encoding="utf-8")
    result = GenerationDiff.model_validate_json(report.read_text(encoding="utf-8"))
    assert result.cause is not None and result.cause.kind == "kv-cache"
    (check,) = result.remedies
    assert check.remedy == "cache-model-dtype" and check.verdict == "verified"
    assert "the KV cache kept in the model&#x27;s dtype" in page.read_text()


def test_the_kept_cache_keeps_its_containers_types() -> None:
    """A cache of namedtuples in a dict (a user's own step convention) comes back as one:
    only the cast tensor is replaced, by its bf16 source."""
    from collections import namedtuple

    Entry = namedtuple("Entry", "keys values")

    def step(ids: torch.Tensor, cache: object, keep: int = 1) -> tuple[torch.Tensor, object]:
        k = torch.full((2,), 3.0, dtype=torch.bfloat16)
        return ids.float(), {"layer0": Entry(k, k.half())}

    kept: list[int] = []
    _, cache = cache_in_model_dtype(step, torch.bfloat16, kept)(torch.ones(1), None)
    entry = cache["layer0"]
    assert isinstance(entry, Entry) and kept == [1]
    assert (entry.keys.dtype, entry.values.dtype) == (torch.bfloat16, torch.bfloat16)
