"""Unusable input: exit 2 with one line naming the file, the line and the problem."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import precguard
from precguard.targets import build_tiny_llama, lm_batch
from tests.compare.conftest import record, run_cli


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("bad")
    return record(base / "golden"), record(base / "actual")


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


def _one_line_error(code: int, err: str) -> str:
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("precguard: error: ")
    assert "Traceback" not in err
    return lines[0]


def test_missing_directory(tmp_path: Path, pair, capsys) -> None:
    code, _, err = run_cli(["compare", str(pair[0]), str(tmp_path / "nope")], capsys)
    line = _one_line_error(code, err)
    assert "nope" in line and "no such recording directory" in line


def test_corrupt_jsonl_line_names_file_and_line(tmp_path: Path, pair, capsys) -> None:
    bad = _copy(pair[1], tmp_path / "bad")
    path = bad / "rank0" / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[4] = '{"key": "model.embed_tokens.0.forward.output.0", "modu\n'
    path.write_text("".join(lines))

    code, _, err = run_cli(["compare", str(pair[0]), str(bad)], capsys)

    line = _one_line_error(code, err)
    assert "records.jsonl line 5" in line and "malformed JSON" in line


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path: Path, pair, capsys) -> None:
    cut = _copy(pair[1], tmp_path / "cut")
    path = cut / "rank0" / "records.jsonl"
    text = path.read_text()
    path.write_text(text[: len(text) - 40])  # the last record loses its end and newline

    code, _, err = run_cli(["compare", str(pair[0]), str(cut)], capsys)

    assert code == 0, err
    assert "truncated_last_line_skipped" in err
    result = precguard.compare_runs(pair[0], cut)
    assert len(result.unmatched.golden_only) == 1
    assert result.verdict == "match"


def test_truncated_safetensors_file(tmp_path: Path, pair, capsys) -> None:
    bad = _copy(pair[1], tmp_path / "trunc")
    st = next((bad / "rank0").glob("tensors-*.safetensors"))
    data = st.read_bytes()
    st.write_bytes(data[: len(data) // 2])

    code, _, err = run_cli(["compare", str(pair[0]), str(bad)], capsys)

    line = _one_line_error(code, err)
    assert st.name in line and "truncated" in line


def test_newer_schema_manifest(tmp_path: Path, pair, capsys) -> None:
    newer = _copy(pair[1], tmp_path / "newer")
    manifest = json.loads((newer / "manifest.json").read_text())
    manifest["schema_version"] = 99
    (newer / "manifest.json").write_text(json.dumps(manifest))

    code, _, err = run_cli(["compare", str(pair[0]), str(newer)], capsys)

    line = _one_line_error(code, err)
    assert "manifest.json" in line and "schema_version 99" in line


def test_recordings_of_different_models(tmp_path: Path, pair, capsys) -> None:
    wider = precguard.Target(
        model=lambda: build_tiny_llama(hidden_size=32, intermediate_size=88),
        batch=lm_batch,
        name="wider",
    )
    other = precguard.record_target(wider, out=tmp_path / "other", tensors=True)

    code, _, err = run_cli(["compare", str(pair[0]), str(other)], capsys)

    line = _one_line_error(code, err)
    assert "different model" in line and "model.embed_tokens" in line
    assert "other/rank0/records.jsonl" in line


def test_recordings_of_different_model_classes(tmp_path: Path, pair, capsys) -> None:
    import torch

    mlp = precguard.Target(
        model=lambda: torch.nn.Sequential(torch.nn.Linear(4, 4)),
        batch=lambda step: torch.ones(2, 4),
        name="mlp",
    )
    other = precguard.record_target(mlp, out=tmp_path / "mlp")

    code, _, err = run_cli(["compare", str(pair[0]), str(other)], capsys)

    line = _one_line_error(code, err)
    assert "Sequential" in line and "LlamaForCausalLM" in line


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--profile", "lax"], "unknown tolerance profile 'lax'"),
        (["--rank", "3"], "has no rank 3"),
        (["--step", "7"], "step 7"),
        (["--rtol", "-1"], "--rtol must be"),
    ],
)
def test_bad_options(args: list[str], needle: str, pair, capsys) -> None:
    code, _, err = run_cli(["compare", str(pair[0]), str(pair[1]), *args], capsys)
    line = _one_line_error(code, err)
    assert needle in line


def test_recordings_that_share_no_step(tmp_path: Path, pair, capsys) -> None:
    later = _copy(pair[1], tmp_path / "later")
    path = later / "rank0" / "records.jsonl"
    records = [json.loads(line) | {"step": 5} for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))

    code, _, err = run_cli(["compare", str(pair[0]), str(later)], capsys)

    line = _one_line_error(code, err)
    assert "share no step" in line
