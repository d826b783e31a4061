"""Padded positions are left out of the metrics (issue 28): eager vs SDPA on a padded batch.

With left or right padding, the hidden states at padded query positions are
undefined — eager attention and SDPA treat a fully masked row differently — and
nothing reads them. Compared as errors, a correct SDPA run was called DIVERGED
at ``model`` (error 0.1, 2.7e5 times what float32 explains). compare now learns
the padding from the root call's ``attention_mask`` and measures the hidden
states over the real positions only; a fault in a padded pair is still named.
"""

from __future__ import annotations

import pytest
import torch

import precguard
from precguard import Record
from precguard.compare.padding import mask_metrics
from precguard.targets import build_tiny_llama

pytest.importorskip("transformers")


def _ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))


def _mask(side: str) -> torch.Tensor:
    mask = torch.ones(2, 32, dtype=torch.long)
    if side == "all":
        mask[:] = 0
    elif side == "none":
        pass
    elif side == "left":
        mask[0, :5] = 0
    else:
        mask[1, -7:] = 0
    return mask


def _record(tmp_path, impl: str, tensors, *, padding="left", fault=False, name=None):
    torch.manual_seed(0)
    model = build_tiny_llama(num_hidden_layers=2, attn_implementation=impl).eval()
    if fault:  # a 3 % scale in one projection: a real error at every position
        model.model.layers[1].mlp.down_proj.register_forward_hook(lambda m, a, out: out * 1.03)
    out = tmp_path / (name or impl)
    with precguard.monitor(model, out, tensors=tensors), torch.no_grad():
        model(input_ids=_ids(), attention_mask=_mask(padding))
    return out


@pytest.mark.parametrize("padding", ["left", "right"])
@pytest.mark.parametrize("tensors", [True, False], ids=["full", "statistics"])
def test_a_padded_sdpa_run_matches_eager_and_says_what_was_left_out(tmp_path, padding, tensors):
    golden = _record(tmp_path, "eager", True, padding=padding)
    actual = _record(tmp_path, "sdpa", tensors, padding=padding)
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "match", result.first_divergence
    padded = 5 if padding == "left" else 7
    notes = [w for w in result.warnings if "padded positions (attention_mask = 0)" in w]
    assert len(notes) == 1
    assert notes[0].startswith(f"{padded} padded positions (attention_mask = 0) left out of")
    assert ("records on full tensors" if tensors else "statistics-only records") in notes[0]
    # the layers' 4-d masks (additive float for eager, bool for SDPA) compared as masks
    mask = next(r for r in result.records if r.key == "model.layers.0.0.forward.input.1")
    assert mask.status == "pass" and "as attention masks" in (mask.metrics.note or "")


def test_the_premise_eager_and_sdpa_differ_at_padded_positions_only():
    """Why the pair above needs the padding left out: compared over every position, the
    hidden states differ by far more than float32 explains, over the real ones not."""
    hidden = {}
    for impl in ("eager", "sdpa"):
        torch.manual_seed(0)
        model = build_tiny_llama(num_hidden_layers=2, attn_implementation=impl).eval()
        with torch.no_grad():
            hidden[impl] = model.model(input_ids=_ids(), attention_mask=_mask("left"))[0]
    g, a = hidden["eager"], hidden["sdpa"]
    assert float((a - g).norm() / g.norm()) > 1e-2
    real = _mask("left").bool()
    assert float((a - g)[real].norm() / g[real].norm()) < 1e-5


@pytest.mark.parametrize("tensors", [True, False], ids=["full", "statistics"])
def test_a_fault_in_a_padded_pair_is_still_named(tmp_path, tensors):
    golden = _record(tmp_path, "eager", True)
    actual = _record(tmp_path, "sdpa", tensors, fault=True)
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    assert result.first_divergence.module == "model.layers.1.mlp.down_proj"


def test_a_mask_recorded_as_statistics_only_says_padding_could_not_be_left_out(tmp_path):
    golden = _record(tmp_path, "eager", False, name="golden")
    actual = _record(tmp_path, "sdpa", False, name="actual")
    result = precguard.compare_runs(golden, actual)
    notes = [w for w in result.warnings if "could not be left out" in w]
    assert len(notes) == 1
    assert "marks 5 padded positions" in notes[0] and "--tensors root" in notes[0]


def test_recording_the_root_in_full_is_enough_to_leave_padding_out(tmp_path):
    """What that note advises: the root's inputs in full, every other module statistics."""
    golden = _record(tmp_path, "eager", ["root"], name="golden")
    actual = _record(tmp_path, "sdpa", ["root"], name="actual")
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "match", result.first_divergence
    assert any(w.startswith("5 padded positions") for w in result.warnings)


def _rec(dtype: str, shape: list[int]) -> Record:
    return Record(
        key="m.0.forward.input.1",
        module="m",
        module_type="M",
        call=0,
        phase="forward",
        role="input",
        index=1,
        name="kwargs.attention_mask",
        step=0,
        rank=0,
        seq=3,
        dtype=dtype,
        shape=shape,
    )


def test_a_bool_mask_and_an_additive_mask_are_compared_as_masks():
    from precguard.compare.padding import StepPadding

    attend = torch.ones(1, 1, 4, 4, dtype=torch.bool).tril()
    additive = torch.zeros(1, 1, 4, 4).masked_fill(~attend, torch.finfo(torch.float32).min)
    none = StepPadding([], [])
    same = mask_metrics(_rec("float32", [1, 1, 4, 4]), _rec("bool", [1, 1, 4, 4]), additive,
                        attend, none)  # fmt: skip
    assert same is not None and same.mismatched == 0
    other = attend.clone()
    other[0, 0, 3, 3] = False
    differ = mask_metrics(_rec("float32", [1, 1, 4, 4]), _rec("bool", [1, 1, 4, 4]), additive,
                          other, none)  # fmt: skip
    assert differ is not None and differ.mismatched == 1
    # a float tensor that is not a mask (a bias) is not compared as one
    bias = additive.clone()
    bias[0, 0, 0, 0] = -0.5
    assert mask_metrics(_rec("float32", [1, 1, 4, 4]), _rec("bool", [1, 1, 4, 4]), bias,
                        attend, none) is None  # fmt: skip


def test_no_padding_no_note(tmp_path):
    golden = _record(tmp_path, "eager", True, padding="none", name="golden")
    actual = _record(tmp_path, "sdpa", True, padding="none", name="actual")
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "match", result.first_divergence
    assert not [w for w in result.warnings if "padded positions" in w], result.warnings


def test_a_batch_with_no_real_position_is_compared_as_recorded_not_passed(tmp_path):
    """Leaving out every position would compare nothing: a fault must still be named."""
    golden = _record(tmp_path, "eager", True, padding="all", name="golden")
    actual = _record(tmp_path, "eager", True, padding="all", fault=True, name="actual")
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "diverged"
    assert result.first_divergence.module == "model.layers.1.mlp.down_proj"
    assert not [w for w in result.warnings if "left out of" in w]
