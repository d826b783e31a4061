"""generate-diff's terminal after a KV-cache fault: the cache is the cause, KL non-finite.

The story: a decoding step keeps its KV cache in fp16; a value past 65504 turns
the next step's logits to NaN/Inf. The summary must not average the finite steps
into a tiny KL, and the layerwise replay (which reads each side's own cache) must
not blame the layer that reads the cache, nor "different data".
"""

from __future__ import annotations

import io
import math

from rich.console import Console

from precguard import generate_diff
from precguard.generation.render import render_terminal
from tests.generation import targets as T


def test_a_cache_fault_is_named_as_the_cause_and_its_kl_is_non_finite() -> None:
    result = generate_diff(
        T.step_llama_fp16_cache(),
        reference_target=T.step_llama(),
        device="cpu",
        prompts=[T.PROMPTS[0]],
        max_new_tokens=3,
    )
    assert result.prompts[0].kv_cache is not None
    assert result.prompts[0].kv_cache.verdict == "cache"
    assert result.summary.mean_kl is not None and math.isinf(result.summary.mean_kl)
    buffer = io.StringIO()
    render_terminal(result, Console(file=buffer, width=400, color_system=None))
    text = buffer.getvalue()
    assert "mean KL non-finite" in text and "step(s) with NaN/Inf logits" in text
    assert "fed different data" not in text
    assert "the actual's KV cache is faulty" in text
    assert "cause: kv-cache layers.1.values" in text
