"""Keyword inputs are paired by name: eager attention vs SDPA (issue 28 item 3).

Eager attention passes ``attention_mask`` to every decoder layer; SDPA without
padding passes none. Paired by position, the mask [2,1,S,S] was compared with
the next input (``position_embeddings.0``) and the run was called DIVERGED at
``model.layers.0`` while the logits differ by 2e-7.
"""

from __future__ import annotations

import pytest
import torch

import precguard
from precguard import Record
from precguard.compare.align import align
from precguard.targets import build_tiny_llama

transformers = pytest.importorskip("transformers")


def _llama(impl: str) -> torch.nn.Module:
    torch.manual_seed(0)
    return build_tiny_llama(num_hidden_layers=2, attn_implementation=impl).eval()


def _record(tmp_path, impl: str, **options):
    ids = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    model = _llama(impl)
    out = tmp_path / impl
    with precguard.monitor(model, out, **options), torch.no_grad():
        model(ids)
    return out


@pytest.mark.parametrize("tensors", [False, True], ids=["statistics", "full"])
def test_sdpa_against_eager_matches_and_names_the_mask_only_eager_passed(tmp_path, tensors):
    eager = _record(tmp_path, "eager", tensors=tensors)
    sdpa = _record(tmp_path, "sdpa", tensors=tensors)
    result = precguard.compare_runs(eager, sdpa)
    assert result.verdict == "match", result.first_divergence
    notes = [w for w in result.warnings if w.startswith("only golden passed")]
    assert len(notes) == 1
    assert "kwargs.attention_mask to model.layers.0, model.layers.0.self_attn" in notes[0]
    assert any(w.startswith("only golden returned output.1 from") for w in result.warnings)
    # the mask was compared with nothing; position_embeddings with position_embeddings
    layer0 = {r.key: r for r in result.records if r.module == "model.layers.0"}
    assert layer0["model.layers.0.0.forward.input.1"].status == "missing"
    assert layer0["model.layers.0.0.forward.input.2"].actual_key == (
        "model.layers.0.0.forward.input.1"
    )
    # one-sided inputs are told in their note, not in the unmatched list
    assert not result.unmatched.golden_only and not result.unmatched.actual_only


def _rec(key: str, name: str, shape: list[int], seq: int) -> Record:
    module, call, phase, role, index = key.rsplit(".", 4)
    return Record(
        key=key,
        module=module,
        module_type="M",
        call=int(call),
        phase=phase,
        role=role,
        index=int(index),
        name=name,
        step=0,
        rank=0,
        seq=seq,
        dtype="float32",
        shape=shape,
    )


def test_an_input_passed_by_position_on_one_side_and_by_keyword_on_the_other_is_paired():
    golden = [_rec("m.0.forward.input.0", "args.0", [2, 8], 0)]
    actual = [_rec("m.0.forward.input.0", "kwargs.hidden_states", [2, 8], 0)]
    a = align(golden, actual)
    assert len(a.pairs) == 1 and not a.one_sided


def test_two_different_keywords_are_never_paired_even_with_one_shape():
    golden = [
        _rec("m.0.forward.input.0", "kwargs.x", [2, 8], 0),
        _rec("m.0.forward.input.1", "kwargs.mask", [2, 8], 1),
    ]
    actual = [
        _rec("m.0.forward.input.0", "kwargs.x", [2, 8], 0),
        _rec("m.0.forward.input.1", "kwargs.bias", [2, 8], 1),
    ]
    a = align(golden, actual)
    assert [(g.name, x.name) for g, x in a.pairs] == [("kwargs.x", "kwargs.x")]
    assert [(side, r.name) for side, r in a.one_sided] == [
        ("golden", "kwargs.mask"),
        ("actual", "kwargs.bias"),
    ]


def test_recordings_without_names_are_still_paired_by_key():
    golden = [_rec("m.0.forward.input.0", "", [2, 8], 0)]
    actual = [_rec("m.0.forward.input.0", "", [2, 8], 0)]
    assert len(align(golden, actual).pairs) == 1
