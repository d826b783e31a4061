"""precguard replay: one module alone with the golden's inputs, its local error."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from precguard import replay_module
from tests.compare.conftest import record, run_cli

FAULTY_TARGET = """
from precguard.targets import tiny_llama


def target():
    t = tiny_llama()
    build = t.model

    def model():
        m = build()
        down = m.get_submodule("model.layers.1.mlp.down_proj")
        down.register_forward_hook(lambda _m, _args, out: out * 1.001)
        return m

    t.model = model
    t.name = "faulty"
    return t
"""


def test_replay_on_the_same_backend_matches(tiny_golden: Path, tmp_path: Path, capsys) -> None:
    report = tmp_path / "replay.json"
    code, out, err = run_cli(
        ["replay", str(tiny_golden), "--module", "model.layers.1", "--target", "tiny-llama",
         "--json", str(report)],
        capsys,
    )  # fmt: skip
    assert code == 0, err
    # "local error 0" alone would also match "local error 0.0031"
    assert "MATCH" in out and re.search(r"local error 0(?![.\d])", out), out
    data = json.loads(report.read_text())
    assert data["local_error"] == 0.0
    assert data["outputs"] and all(o["status"] == "pass" for o in data["outputs"])


def test_replay_measures_the_local_error_of_a_faulty_module(
    tiny_golden: Path, tmp_path: Path, capsys
) -> None:
    target = tmp_path / "faulty.py"
    target.write_text(FAULTY_TARGET)
    report = tmp_path / "replay.json"

    code, out, err = run_cli(
        ["replay", str(tiny_golden), "-m", "model.layers.1.mlp", "--target", str(target),
         "--device", "cpu", "--json", str(report)],
        capsys,
    )  # fmt: skip

    assert code == 1, err
    assert "DIVERGED" in out
    data = json.loads(report.read_text())
    assert data["verdict"] == "diverged"
    assert data["local_error"] == pytest.approx(1e-3, rel=1e-2)
    # the module upstream of the fault replays clean: its error would be propagated
    clean = replay_module(tiny_golden, "model.layers.1.self_attn", target=str(target))
    assert clean.verdict == "match"


def test_replay_in_another_dtype_is_judged_at_that_dtypes_precision(tiny_golden: Path) -> None:
    # a clean MLP in bf16 differs from its fp32 golden by bf16 rounding: that dtype's local
    # error, reported, and explained by bf16 precision (not judged at the golden's fp32)
    result = replay_module(tiny_golden, "model.layers.0.mlp", target="tiny-llama", dtype="bfloat16")
    assert result.dtype == "bfloat16"
    assert result.verdict == "match"
    assert 1e-4 < result.local_error < 5e-2
    assert not result.warnings  # the bf16 weights are the golden's, rounded


def test_replay_names_the_missing_tensors(tmp_path: Path, capsys) -> None:
    golden = record(tmp_path / "partial", tensors=["model.layers.0.*"])
    code, _, err = run_cli(["replay", str(golden), "--module", "model.layers.1.mlp"], capsys)
    assert code == 2
    line = err.strip()
    assert "\n" not in line
    assert "model.layers.1.mlp.0.forward.input.0" in line
    assert "model.layers.1.mlp.0.forward.output.0" in line
    assert "--tensors 'model.layers.1.mlp'" in line


def test_replay_of_an_unknown_module(tiny_golden: Path, capsys) -> None:
    code, _, err = run_cli(["replay", str(tiny_golden), "--module", "model.nope"], capsys)
    assert code == 2
    assert "no forward records of module 'model.nope'" in err
