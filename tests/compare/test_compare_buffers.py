"""What a module reads besides its arguments and weights: its buffers, recorded and named.

The story: a user casts an HF LLaMA with ``model.to(torch.bfloat16)``. ``to()``
rounds the rotary embedding's ``inv_freq`` buffer too, so every angle comes from
rounded frequencies and ``model.rotary_emb`` is named at long sequences. That is a
real error, and compare must say where it comes from (the buffer) and what to do
(keep ``inv_freq`` in float32), not "its inputs match (error 0)".
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import precguard
from precguard.compare import compare_recordings
from precguard.targets import build_tiny_llama, lm_batch

SEQ = 512


def run(out: Path, dtype: torch.dtype, *, keep_inv_freq: bool = False) -> Path:
    torch.manual_seed(0)
    model = build_tiny_llama(num_hidden_layers=2, max_position_embeddings=2 * SEQ)
    inv_freq = model.model.rotary_emb.inv_freq.clone()
    model = model.to(dtype)
    if keep_inv_freq:  # the remedy: the frequencies in float32, as computed
        model.model.rotary_emb.inv_freq = inv_freq
    with torch.no_grad(), precguard.monitor(model, out, backward=False):
        model(input_ids=lm_batch(0, batch=1, seq=SEQ)["input_ids"])
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("buffers")
    return {
        "golden": run(root / "g", torch.float32),
        "bf16": run(root / "a", torch.bfloat16),
        "kept": run(root / "k", torch.bfloat16, keep_inv_freq=True),
    }


def test_buffers_are_recorded_beside_the_params(runs: dict[str, Path]) -> None:
    recs = [r for r in precguard.load_run(runs["bf16"]).records() if r.role == "buffer"]
    assert {(r.module, r.name) for r in recs} >= {("model.rotary_emb", "inv_freq")}
    assert all(r.phase == "forward" and r.call == 0 for r in recs)
    inv = next(r for r in recs if r.name == "inv_freq")
    assert inv.dtype == "bfloat16"


def test_a_rounded_inv_freq_is_named_with_its_remedy(runs: dict[str, Path]) -> None:
    result = compare_recordings(runs["golden"], runs["bf16"])
    first = result.first_divergence
    assert first is not None and first.module == "model.rotary_emb"
    assert "its buffer inv_freq differs" in first.reason
    assert "stored as bfloat16 where golden has float32" in first.reason
    # the remedies are the candidates, in the order --verify tries them: the buffer first,
    # never alone (the angles may be computed in bfloat16 too: compare/advice.py)
    remedies = [a.remedy for a in first.remedies]
    assert remedies == ["float32-buffers", "float32-compute", "reference-precision"]
    assert first.remedies[0].text.startswith("keep `inv_freq`")
    assert "in float32 (model.to(bfloat16) casts float buffers too" in first.remedies[0].text


def test_swapped_sides_are_warned_about_first(runs: dict[str, Path]) -> None:
    """Given in swapped order the advice would read "keep inv_freq in bfloat16": one line
    says the sides look swapped, first among the warnings (issue 39)."""
    result = compare_recordings(runs["bf16"], runs["golden"])
    assert result.warnings[0].startswith("the sides look swapped: the golden is in bfloat16")
    right = compare_recordings(runs["golden"], runs["bf16"])
    assert not any("swapped" in w for w in right.warnings)


def test_keeping_inv_freq_in_float32_matches(runs: dict[str, Path]) -> None:
    result = compare_recordings(runs["golden"], runs["kept"])
    assert result.verdict == "match", result.first_divergence


def _without_buffers(src: Path, dst: Path) -> Path:
    """A copy of a recording as an older precguard wrote it: no buffer records."""
    dst.mkdir()
    for f in src.rglob("*"):
        target = dst / f.relative_to(src)
        if f.is_dir():
            target.mkdir(exist_ok=True)
        elif f.name == "records.jsonl":
            lines = [x for x in f.read_text().splitlines() if json.loads(x)["role"] != "buffer"]
            target.write_text("".join(x + "\n" for x in lines))
        else:
            target.write_bytes(f.read_bytes())
    return dst


def test_recordings_without_buffer_records_compare_as_before(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    golden = _without_buffers(runs["golden"], tmp_path / "g")
    actual = _without_buffers(runs["bf16"], tmp_path / "a")
    result = compare_recordings(golden, actual)
    first = result.first_divergence
    assert first is not None and first.module == "model.rotary_emb"
    assert "buffer" not in first.reason
    assert not result.unmatched.golden_only and not result.unmatched.actual_only


def test_an_older_recording_against_one_with_buffers_compares_as_before(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    golden = _without_buffers(runs["golden"], tmp_path / "g")
    result = compare_recordings(golden, runs["kept"])
    assert result.verdict == "match", result.first_divergence
    assert not result.unmatched.golden_only and not result.unmatched.actual_only
    assert result.coverage is not None and result.coverage.complete
