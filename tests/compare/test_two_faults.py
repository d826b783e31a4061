"""Two planted faults in one bf16 model: both are findings (issue 37).

The story: a user's tiny LLaMA runs on ``emu:bf16`` with two bugs, a GELU where the
model has SiLU in layer 1 and an ``o_proj`` whose output is 1 % too large in layer 3.
compare names the first as the first divergence, as before, and then lists the second
as a further finding: judged as the first was, named in full in the JSON and on the
terminal, not left to a ranked table whose narrow column cuts the name off.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import precguard
from tests.compare.bf16_suite import _gelu_instead, _output_scaled, round_to_bf16
from tests.compare.conftest import run_cli

GELU = "model.layers.1.mlp.act_fn"
O_PROJ = "model.layers.3.self_attn.o_proj"


def _two_faults(model) -> None:
    round_to_bf16(model)
    _gelu_instead(model.get_submodule(GELU))
    _output_scaled(1.01)(model.get_submodule(O_PROJ))


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("two-faults")
    golden = precguard.record_target(
        "tiny-llama", out=root / "g", tensors=True, prepare=round_to_bf16, device="cpu"
    )
    actual = precguard.record_target(
        "tiny-llama", out=root / "a", tensors=True, prepare=_two_faults, device="emu:bf16"
    )
    return Path(golden), Path(actual)


def test_the_second_fault_three_layers_on_is_a_further_finding(runs) -> None:
    result = precguard.compare_runs(*runs)
    assert result.verdict == "diverged"
    fd = result.first_divergence
    assert fd is not None and fd.module == GELU and fd.local is True
    assert [(f.module, f.phase) for f in result.further_findings] == [(O_PROJ, "forward")]
    assert "scaled by 1.01" in result.further_findings[0].reason


def test_the_terminal_and_the_json_name_both(runs, capsys, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    code, stdout, _ = run_cli(["compare", *map(str, runs), "--json", str(out)], capsys)
    assert code == 1
    assert "further findings (1" in stdout
    assert f"  {O_PROJ} (Linear), forward, step 0" in stdout  # the full name, on its own line
    data = json.loads(out.read_text())
    assert data["first_divergence"]["module"] == GELU
    assert [f["module"] for f in data["further_findings"]] == [O_PROJ]


def test_a_single_fault_has_no_further_finding(tmp_path: Path) -> None:
    golden = precguard.record_target(
        "tiny-llama", out=tmp_path / "g", prepare=round_to_bf16, device="cpu"
    )

    def one_fault(model) -> None:
        round_to_bf16(model)
        _gelu_instead(model.get_submodule(GELU))

    actual = precguard.record_target(
        "tiny-llama", out=tmp_path / "a", prepare=one_fault, device="emu:bf16"
    )
    result = precguard.compare_runs(golden, actual)
    assert result.first_divergence is not None and result.first_divergence.module == GELU
    assert result.further_findings == []
