"""generate-diff's terminal after a KV-cache fault: the cache is the cause, KL non-finite.

The story: a decoding step keeps its KV cache in fp16; a value past 65504 turns
the next step's logits to NaN/Inf. The summary must not average the finite steps
into a tiny KL, and the layerwise replay (which reads each side's own cache) must
not blame the layer that reads the cache, nor "different data".
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from precguard import GenerationDiff
from precguard.cli import main
from tests.generation import targets as T

TARGETS = Path(T.__file__)


def test_a_cache_fault_is_named_as_the_cause_and_its_kl_is_non_finite(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(T.PROMPTS[0] + "\n", encoding="utf-8")
    report = tmp_path / "generation.json"
    with pytest.raises(SystemExit) as exited:
        main(
            [
                "generate-diff",
                "--target", f"{TARGETS}:step_llama_fp16_cache",
                "--reference-target", f"{TARGETS}:step_llama",
                "--device", "cpu",
                "--prompts", str(prompts),
                "--max-new-tokens", "3",
                "--json", str(report),
            ]
        )  # fmt: skip
    out, err = capsys.readouterr()
    assert exited.value.code == 1, err
    result = GenerationDiff.model_validate_json(report.read_text(encoding="utf-8"))
    assert result.prompts[0].kv_cache is not None
    assert result.prompts[0].kv_cache.verdict == "cache"
    assert result.summary.mean_kl is not None and math.isinf(result.summary.mean_kl)
    text = out + err
    assert "mean KL non-finite" in text and "step(s) with NaN/Inf logits" in text
    assert "fed different data" not in text
    assert "the actual's KV cache is faulty" in text
    assert "cause: kv-cache layers.1.values" in text
