"""The pieces under generate-diff: the near-tie bound, the curves, the cache readers."""

from __future__ import annotations

import math

import pytest
import torch

from precguard import generate_diff
from precguard.generation.decode import cache_tensors, gumbel_noise
from precguard.generation.judge import judge_flip, kl_divergence, top_k_overlap
from precguard.numerics import Z_SCORE, rounding_floor, stacked_floor
from tests.generation import targets as T


def test_the_explained_logit_error_is_the_rounding_floor_grown_over_the_layers() -> None:
    assert stacked_floor("bfloat16", 64, 4) == pytest.approx(2 * rounding_floor("bfloat16", 64))
    # fp32 is 2**16 times more precise than bf16 in its own rounding
    assert stacked_floor("float32", 64, 1) < stacked_floor("bfloat16", 64, 1) / 1000


def test_a_flip_within_the_tolerance_is_a_near_tie_and_beyond_it_a_divergence() -> None:
    gen = torch.Generator().manual_seed(0)
    golden = torch.randn(256, generator=gen) * 4
    top2 = torch.topk(golden, 2).indices.tolist()
    explained = stacked_floor("bfloat16", 64, 4)
    scale = float(golden.pow(2).mean().sqrt())
    tolerance = Z_SCORE * math.sqrt(2) * explained * scale
    # the actual swaps the top two by a hair: a near-tie if they were that close already
    tied = golden.clone()
    tied[top2[1]] = golden[top2[0]] - 0.1 * tolerance
    actual = tied.clone()
    actual[top2[1]] = tied[top2[0]] + 0.1 * tolerance
    verdict = judge_flip(tied, actual, top2[0], top2[1], explained=explained)
    assert verdict["kind"] == "near-tie"
    # the tolerance is taken from the golden's own logits' RMS
    own = Z_SCORE * math.sqrt(2) * explained * float(tied.pow(2).mean().sqrt())
    assert verdict["tolerance"] == pytest.approx(own)
    # the same swap between tokens 10 tolerances apart is a divergence
    far = golden.clone()
    far[top2[1]] = golden[top2[0]] - 10 * tolerance
    swapped = far.clone()
    swapped[top2[1]] = far[top2[0]] + 0.1 * tolerance
    assert judge_flip(far, swapped, top2[0], top2[1], explained=explained)["kind"] == "divergence"
    # non-finite logits are never a near-tie
    broken = tied.clone()
    broken[0] = math.nan
    assert judge_flip(tied, broken, top2[0], top2[1], explained=explained)["kind"] == "divergence"


def test_kl_and_top_k_overlap() -> None:
    x = torch.tensor([3.0, 1.0, 0.0, -1.0])
    assert kl_divergence(x, x) == 0.0
    p = torch.softmax(x.double(), 0)
    q = torch.softmax(x.flip(0).double(), 0)
    assert kl_divergence(x, x.flip(0)) == pytest.approx(float((p * (p / q).log()).sum()))
    # a step that ended in NaN/Inf is infinitely far, never left out of a mean KL
    assert kl_divergence(x, torch.tensor([math.inf, 0, 0, 0])) == math.inf
    assert kl_divergence(x, torch.tensor([math.nan, 0, 0, 0])) == math.inf
    assert top_k_overlap(x, x.flip(0), 2) == 0.0 and top_k_overlap(x, x, 3) == 1.0


def test_sampling_noise_is_the_same_on_every_call_and_differs_per_prompt() -> None:
    a = gumbel_noise(5, 0, 3, 16)
    assert torch.equal(a, gumbel_noise(5, 0, 3, 16))
    assert not torch.equal(a, gumbel_noise(5, 1, 3, 16))
    assert torch.isfinite(a).all()


def test_cache_readers_name_each_layers_keys_and_values() -> None:
    k, v = torch.ones(1, 2, 3, 4), torch.zeros(1, 2, 3, 4, dtype=torch.float16)
    legacy = cache_tensors(((k, v), (k, v)))
    assert list(legacy) == ["layers.0.keys", "layers.0.values", "layers.1.keys", "layers.1.values"]
    assert legacy["layers.0.values"].dtype == torch.float16  # the stored dtype stays visible
    assert list(cache_tensors({"kv": [k]})) == ["kv.0"]


def test_rope_at_the_wrong_offset_with_a_cache_is_traced_to_the_cache() -> None:
    # the prefill rotates positions 0..P-1 right; each cached step rotates its token as
    # position 0: only the cache path is wrong, and its own cache-free forward says so
    result = generate_diff(
        T.rope_offset_bug(),
        reference_target=T.step_peaked(),
        device="cpu",
        prompts=[T.PROMPTS[0]],
        max_new_tokens=3,
        layerwise=False,
    )
    kv = result.prompts[0].kv_cache
    assert kv is not None and kv.verdict == "cache"
    assert kv.consistency is not None
    assert kv.consistency.golden_consistent and not kv.consistency.actual_consistent
    # the prefill's caches agree: the fault starts with the first cached step
    assert kv.snapshots[0].first_divergence is None


def test_a_reference_with_non_finite_logits_is_unusable() -> None:
    from precguard import UsageError

    def poison(model: torch.nn.Module) -> None:
        with torch.no_grad():
            model.lm_head.weight[5] = math.nan

    with pytest.raises(UsageError, match="cannot serve as the golden"):
        generate_diff(
            T.peaked(), device="cpu", prompts=[[1, 2, 3]], max_new_tokens=1,
            prepare_reference=poison,
        )  # fmt: skip


class _NoCache(torch.nn.Module):
    """A decoder without a KV cache: forward(input_ids) -> logits."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(32, 16)
        self.head = torch.nn.Linear(16, 32)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cumsum(self.embed(input_ids), dim=1)) * 10


def test_a_model_without_a_cache_decodes_by_rerunning_the_sequence() -> None:
    from precguard import Target

    target = Target(model=_NoCache, batch=lambda step: torch.tensor([[1, 2, 3]]), name="no-cache")
    result = generate_diff(target, device="cpu", max_new_tokens=3)
    assert result.verdict == "match" and len(result.prompts[0].golden_tokens) == 3
    assert result.prompts[0].kv_cache is None  # nothing to compare, nothing claimed
