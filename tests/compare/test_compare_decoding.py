"""A recording of generate() whose tokens part is a decoding divergence, not layer errors.

The story: a user runs HF ``generate()`` under ``precguard.monitor`` with a KV cache,
16 new tokens, on the CPU in fp32 (golden) and in emulated bf16. At one step the
two sides choose different tokens (a near-tie of the logits); every later step then
reads other tokens and a cache built from them. compare must name the step where
the inputs parted, call it a decoding divergence and point to ``generate-diff``,
not list the layers of the later steps as suspects.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precguard
from precguard import resolve_backend
from precguard.compare import compare_recordings
from precguard.targets import build_tiny_llama

#: a prompt seed whose greedy tokens part at the 7th new token (fp32 vs emu:bf16)
PROMPT_SEED = 8


def generate(out: Path, device: str, new_tokens: int = 16) -> torch.Tensor:
    torch.manual_seed(0)
    model = build_tiny_llama(num_hidden_layers=2).eval()
    prompt = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(PROMPT_SEED))
    compute = "bfloat16" if device == "emu:bf16" else None
    with (
        torch.no_grad(),
        resolve_backend(device).numerics(),
        precguard.monitor(model, out, backward=False, device=device, compute_dtype=compute),
    ):
        return model.generate(
            prompt, max_new_tokens=new_tokens, do_sample=False, use_cache=True, pad_token_id=0
        )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int]:
    root = tmp_path_factory.mktemp("decode")
    golden = generate(root / "g", "cpu")
    actual = generate(root / "a", "emu:bf16")
    parted = (golden != actual).nonzero()
    assert len(parted), "the tokens must part for this story"
    return root / "g", root / "a", int(parted[0, 1]) - 8  # the new token that differs


def test_parted_tokens_are_a_decoding_divergence(runs: tuple[Path, Path, int]) -> None:
    golden, actual, chosen = runs
    result = compare_recordings(golden, actual)
    # a correct run whose greedy tokens part at a near-tie: no layer is named, the steps
    # before the parting match, and the rest is a gap of the coverage (a partial match)
    assert result.verdict == "match" and result.first_divergence is None
    assert result.coverage is not None and not result.coverage.complete
    gap = result.coverage.gaps[0]
    # step 0 is the prefill; the token chosen at step k is the input of step k + 1
    assert gap.startswith(f"steps {chosen + 1}-")
    assert "decoding divergence" in gap and "generate-diff" in gap
    assert f"at step {chosen}" in gap
    assert not result.suspects


def test_the_steps_before_the_tokens_part_match(runs: tuple[Path, Path, int]) -> None:
    golden, actual, chosen = runs
    result = compare_recordings(golden, actual)
    assert all(r.status == "pass" for r in result.records if r.step <= chosen and r.metrics)
