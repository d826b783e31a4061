"""``precguard plugins``, ``precguard env`` and device errors, through the real CLI entry point."""

from __future__ import annotations

import json

import pytest

from precguard.cli import main


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = 0
    try:
        main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_plugins_json_lists_builtins_and_vendor_plugins(capsys) -> None:
    code, out, _ = run_cli(["plugins", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    by_name = {p["name"]: p for p in doc["plugins"]}
    assert {"cpu", "emu", "cuda", "ascend", "cambricon"} <= set(by_name)
    assert by_name["ascend"]["device_types"] == ["npu"]
    assert by_name["ascend"]["distribution"] == "precguard-ascend"
    assert by_name["ascend"]["version"] == "0.1.0"
    assert "precguard_to_host" in by_name["ascend"]["hooks"]
    assert by_name["emu"]["builtin"] and by_name["emu"]["device_types"] == ["emu"]
    assert by_name["cambricon"]["device_types"] == ["mlu"]


def test_plugins_table(capsys) -> None:
    code, out, _ = run_cli(["plugins"], capsys)
    assert code == 0
    assert out.splitlines()[0].split() == ["plugin", "from", "devices", "hooks"]
    assert any(line.startswith("ascend") and "npu" in line for line in out.splitlines())


def test_record_on_npu_without_torch_npu_exits_2_with_the_reason(
    capsys, tmp_path, no_npu_sdk
) -> None:
    code, _, err = run_cli(
        ["record", "-t", "tiny-llama", "--device", "npu", "--out", str(tmp_path / "r")], capsys
    )
    assert code == 2
    assert (
        err.strip() == "precguard: error: device 'npu' is unavailable: torch_npu is not installed"
    )
    assert not (tmp_path / "r").exists()


def test_unknown_device_exits_2(capsys) -> None:
    code, _, err = run_cli(["env", "--device", "quantum"], capsys)
    assert code == 2
    assert "unknown device 'quantum'" in err and "npu" in err


def test_env_shows_variables_without_the_sdk(capsys, monkeypatch, no_npu_sdk) -> None:
    monkeypatch.setenv("HCCL_DETERMINISTIC", "true")
    code, out, _ = run_cli(["env", "--device", "npu", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["available"] is False and doc["reason"] == "torch_npu is not installed"
    assert doc["fingerprint"]["env.HCCL_DETERMINISTIC"] == "true"
    code, out, _ = run_cli(["env", "--device", "npu"], capsys)
    assert out.splitlines()[0] == "device: npu (unavailable: torch_npu is not installed)"


def test_env_for_an_emulated_device(capsys) -> None:
    code, out, _ = run_cli(["env", "--device", "emu:fp16-saturate", "--json"], capsys)
    assert code == 0
    facts = json.loads(out)["fingerprint"]
    assert facts["emu.overflow"] == "saturate" and facts["emu.compute_dtype"] == "float16"
