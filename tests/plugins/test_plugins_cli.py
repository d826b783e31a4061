"""``precguard plugins``, ``precguard env`` and device errors, through the real CLI entry point.

The Ascend-specific CLI runs (no torch_npu) are in plugins/precguard-ascend/tests.
"""

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
    assert by_name["ascend"]["hooks"] == [
        "precguard_register_backends",
        "precguard_register_checks",
    ]
    assert "env.ascend_precision_mode" in by_name["ascend"]["checks"]
    assert by_name["emu"]["builtin"] and by_name["emu"]["device_types"] == ["emu"]
    assert by_name["cambricon"]["device_types"] == ["mlu"]


def test_plugins_table(capsys) -> None:
    code, out, _ = run_cli(["plugins"], capsys)
    assert code == 0
    assert out.splitlines()[0].split() == ["plugin", "from", "devices", "hooks"]
    assert any(line.startswith("ascend") and "npu" in line for line in out.splitlines())


def test_unknown_device_exits_2(capsys) -> None:
    code, _, err = run_cli(["env", "--device", "quantum"], capsys)
    assert code == 2
    assert "unknown device 'quantum'" in err and "npu" in err


def test_env_for_an_emulated_device(capsys) -> None:
    code, out, _ = run_cli(["env", "--device", "emu:fp16-saturate", "--json"], capsys)
    assert code == 0
    facts = json.loads(out)["fingerprint"]
    assert facts["emu.overflow"] == "saturate" and facts["emu.compute_dtype"] == "float16"


def test_every_fingerprint_has_torchs_facts_and_only_its_own_devices(capsys) -> None:
    facts = {}
    for device in ("cpu", "emu:fp16", "cuda"):
        code, out, _ = run_cli(["env", "--device", device, "--json"], capsys)
        assert code == 0
        facts[device] = json.loads(out)["fingerprint"]
        assert facts[device]["torch.float32_matmul_precision"] in ("highest", "high", "medium")
        assert "torch.deterministic_algorithms" in facts[device]
    assert "cpu.num_threads" in facts["emu:fp16"]  # the emulator runs on the host CPU
    assert not any(k.startswith("emu.") for k in facts["cpu"])
    assert not any(k.startswith(("cpu.", "emu.")) for k in facts["cuda"])
