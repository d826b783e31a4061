"""What compare suggests and confirms: the replay command it prints works as printed, and
``compare --replay`` measures each suspect's local error beside the inferred one."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from tests.compare.conftest import record, run_cli

# A target whose own code is faulty: the fault is in the actual's code, so only the
# actual's target reproduces it in a replay.
TWO_FAULTS_TARGET = """
from precguard.targets import tiny_llama


def target():
    t = tiny_llama()
    build = t.model

    def model():
        m = build()
        for name, factor in {FAULTS!r}.items():
            m.get_submodule(name).register_forward_hook(
                lambda _m, _args, out, f=factor: out * f
            )
        return m

    t.model = model
    return t
"""

DOWN = "model.layers.1.mlp.down_proj"
UPSTREAM = "model.layers.0.self_attn.o_proj"


def _faulty_target(tmp_path: Path, faults: dict[str, float]) -> Path:
    path = tmp_path / "faulty_target.py"
    path.write_text(TWO_FAULTS_TARGET.replace("{FAULTS!r}", repr(faults)))
    return path


def _hint_line(out: str) -> str:
    lines = [line for line in out.splitlines() if "confirm it alone:" in line]
    assert len(lines) == 1, out
    return lines[0].split("confirm it alone:", 1)[1].strip()


@pytest.mark.slow
def test_printed_replay_command_runs_as_printed(
    tiny_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _faulty_target(tmp_path, {DOWN: 1.001})
    actual = precguard.record_target(str(target), out=tmp_path / "actual", tensors=True)

    code, out, err = run_cli(["compare", str(tiny_golden), str(actual)], capsys)
    assert code == 1, err
    command = shlex.split(_hint_line(out))

    assert command[:3] == ["precguard", "replay", str(tiny_golden)]
    options = dict(zip(command[3::2], command[4::2], strict=True))
    assert options == {
        "--module": DOWN,
        "--target": str(target),  # the actual's: the fault is in its code
        "--device": "cpu",
        "--dtype": "float32",
        "--call": "0",
        "--step": "0",
        "--rank": "0",
    }
    exe = Path(sys.executable).with_name("precguard")
    proc = subprocess.run(
        [str(exe), *command[1:], "--json", str(tmp_path / "replay.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 1, proc.stdout + proc.stderr  # diverged: the error is local
    replay = json.loads((tmp_path / "replay.json").read_text())
    assert replay["module"] == DOWN and replay["verdict"] == "diverged"
    assert replay["local_error"] == pytest.approx(1e-3, rel=1e-2)


def test_compare_replay_confirms_each_suspect(
    tiny_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _faulty_target(tmp_path, {UPSTREAM: 1.0001, DOWN: 1.01})
    actual = precguard.record_target(str(target), out=tmp_path / "actual", tensors=True)
    report = tmp_path / "cmp.json"

    args = ["compare", str(tiny_golden), str(actual), "--replay", "--replay-top", "2"]
    code, out, err = run_cli([*args, "--target", str(target), "--json", str(report)], capsys)

    assert code == 1, err
    assert "replayed alone on cpu" in out
    replays = json.loads(report.read_text())["replays"]
    assert [r["module"] for r in replays] == [UPSTREAM, DOWN]
    for r, factor in zip(replays, (1.0001, 1.01), strict=True):
        assert r["replayed"] and r["verdict"] == "diverged" and r["inferred_local"] is True
        # measured directly: the module alone scales its output by the factor
        assert r["local_error"] == pytest.approx(factor - 1, rel=2e-2)
        assert r["device"] == "cpu" and r["dtype"] == "float32"


def test_compare_replay_of_a_clean_module_says_it_is_not_local(
    tiny_golden: Path, tmp_path: Path
) -> None:
    from precguard import replay_suspects

    target = _faulty_target(tmp_path, {DOWN: 1.01})
    actual = precguard.record_target(str(target), out=tmp_path / "actual", tensors=True)
    result = precguard.compare_runs(tiny_golden, actual)

    # replayed with the golden's own code, the module is clean on this device: the
    # difference lies in the actual's code, which the wrong target does not have
    checked = replay_suspects(result, target="tiny-llama", top=1)
    assert [(r.module, r.verdict, r.local_error) for r in checked.replays] == [(DOWN, "match", 0.0)]


def test_compare_replay_needs_an_explicit_target(
    tiny_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = _faulty_target(tmp_path, {DOWN: 1.01})
    actual = precguard.record_target(str(target), out=tmp_path / "actual", tensors=True)
    sentinel = tmp_path / "imported"
    target.write_text(target.read_text() + f"\nopen({str(sentinel)!r}, 'w').close()\n")

    code, _, err = run_cli(["compare", str(tiny_golden), str(actual), "--replay"], capsys)

    assert code == 2
    line = err.strip()
    assert "\n" not in line and "--replay needs --target" in line
    assert f"--target {target}" in line  # suggested, not imported
    assert not sentinel.exists()


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.out = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(_scale(self.fc(x)))


_FACTOR = {"value": 1.0}


@precguard.precision_monitor
def _scale(h: torch.Tensor) -> torch.Tensor:
    return h * _FACTOR["value"]


def _record_model(out: Path, factor: float, weight_drift: float = 1.0) -> Path:
    torch.manual_seed(0)
    model = _Model()
    with torch.no_grad():
        model.out.weight.mul_(weight_drift)
    _FACTOR["value"] = factor
    try:
        with torch.no_grad(), precguard.monitor(model, out=out, tensors=True):
            model(torch.ones(2, 8))
    finally:
        _FACTOR["value"] = 1.0
    return out


def test_hint_for_a_decorated_function_says_why_there_is_no_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = _record_model(tmp_path / "g", 1.0)
    actual = _record_model(tmp_path / "a", 1.01)

    code, out, _ = run_cli(["compare", str(golden), str(actual)], capsys)

    assert code == 1
    assert "confirm it alone" not in out
    assert "no replay command:" in out and "is a decorated function" in out


def test_no_command_without_a_target_to_name(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = _record_model(tmp_path / "g", 1.0)
    actual = _record_model(tmp_path / "a", 1.0, weight_drift=1.01)

    code, out, _ = run_cli(["compare", str(golden), str(actual)], capsys)

    assert code == 1
    assert "confirm it alone" not in out
    assert "the actual recording names no target" in out


def test_no_hint_when_the_error_came_from_upstream(
    tiny_golden: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    other_data = record(tmp_path / "other", tensors=True)  # same model, same data
    code, out, _ = run_cli(["compare", str(tiny_golden), str(other_data)], capsys)
    assert code == 0 and "confirm it alone" not in out and "no replay command" not in out


def test_replay_runs_on_the_actuals_device(tiny_golden: Path, tmp_path: Path, capsys) -> None:
    from precguard import replay_suspects, resolve_backend

    try:
        resolve_backend("emu:softmax-fp16")
    except precguard.PrecguardError as exc:
        pytest.skip(f"emu:softmax-fp16 unavailable: {exc}")
    actual = record(tmp_path / "softmax", device="emu:softmax-fp16")
    result = precguard.compare_runs(tiny_golden, actual)

    _, out, _ = run_cli(["compare", str(tiny_golden), str(actual)], capsys)
    [command] = [line for line in out.splitlines() if line.startswith("confirm it alone:")]
    assert "--device emu:softmax-fp16" in command and "--target tiny-llama" in command
    checked = replay_suspects(result, target="tiny-llama", top=1)
    [check] = checked.replays
    assert check.module == "model.layers.0.self_attn" and check.device == "emu:softmax-fp16"
    assert check.verdict == "diverged" and check.local_error > 1e-5
