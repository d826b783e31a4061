"""precguard-ascend against the FAKE torch_npu (conftest.py) and without it."""

from __future__ import annotations

import json
import os
import warnings

import pytest
import torch
from precguard_ascend import plugin as ascend_plugin
from precguard_ascend.backend import AscendBackend

from precguard import plugins
from precguard.checks.base import CheckContext
from precguard.cli import main
from precguard.devices import resolve_backend
from precguard.dump.vendor import record_vendor_state
from precguard.errors import DeviceUnavailableError


def _checks() -> dict:
    found: list = []
    ascend_plugin.precguard_register_checks(register=found.append)
    return {c.id: c for c in found}


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = 0
    try:
        main(args)
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def test_without_torch_npu_the_device_is_claimed_and_unavailable(no_npu_sdk: None) -> None:
    backend = plugins.get_backend("npu")
    assert isinstance(backend, AscendBackend)
    assert backend.availability() == (False, "torch_npu is not installed")
    with pytest.raises(DeviceUnavailableError, match="torch_npu is not installed"):
        resolve_backend("npu:0")
    facts = plugins.fingerprint("npu")
    assert facts["npu.available"] is False
    assert facts["npu.torch_npu_version"] is None
    assert "env.HCCL_DETERMINISTIC" in facts  # variables are read without the SDK


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


def test_env_shows_variables_without_the_sdk(capsys, monkeypatch, no_npu_sdk) -> None:
    monkeypatch.setenv("HCCL_DETERMINISTIC", "true")
    code, out, _ = run_cli(["env", "--device", "npu", "--json"], capsys)
    assert code == 0
    doc = json.loads(out)
    assert doc["available"] is False and doc["reason"] == "torch_npu is not installed"
    assert doc["fingerprint"]["env.HCCL_DETERMINISTIC"] == "true"
    code, out, _ = run_cli(["env", "--device", "npu"], capsys)
    assert out.splitlines()[0] == "device: npu (unavailable: torch_npu is not installed)"


def test_availability_with_the_fake_sdk(npu_sdk) -> None:
    assert AscendBackend("npu").availability() == (True, "")
    assert AscendBackend("npu:3").availability()[1] == (
        "npu:3 requested but only 1 NPU(s) are visible"
    )
    npu_sdk.available = False
    ok, reason = AscendBackend("npu").availability()
    assert not ok and "no NPU is visible" in reason


def test_seeding_goes_to_the_npu_generator(npu_sdk) -> None:
    backend = AscendBackend("npu")
    backend.manual_seed(1234)
    assert ("npu.manual_seed_all", 1234) in npu_sdk.calls
    state = backend.get_rng_state()
    backend.manual_seed(99)
    backend.set_rng_state(state)
    assert torch.equal(backend.get_rng_state(), state)
    backend.synchronize()
    assert ("npu.synchronize", None) in npu_sdk.calls


@pytest.mark.parametrize("was_on", [False, True])
def test_deterministic_goes_through_set_deterministic_level_only(
    npu_sdk, monkeypatch: pytest.MonkeyPatch, was_on: bool
) -> None:
    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    if was_on:
        with pytest.warns(UserWarning, match="set_deterministic_level"):
            torch.use_deterministic_algorithms(True)  # as a user might; torch_npu warns
    npu_sdk.calls.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch_npu's warning would fail the test
        with AscendBackend("npu").deterministic():
            assert torch.are_deterministic_algorithms_enabled()
            assert os.environ["HCCL_DETERMINISTIC"] == "true"
            assert npu_sdk.deterministic_level == 1
    assert torch.are_deterministic_algorithms_enabled() == was_on
    assert npu_sdk.deterministic_level == (1 if was_on else 0)
    assert "HCCL_DETERMINISTIC" not in os.environ
    assert npu_sdk.calls == [
        ("npu.set_deterministic_level", 1),
        ("npu.set_deterministic_level", 1 if was_on else 0),
    ]  # never torch.use_deterministic_algorithms, never the level getter (it may write)


def test_an_sdk_without_set_deterministic_level_gets_torchs_switch(npu_sdk, monkeypatch) -> None:
    monkeypatch.delattr(__import__("torch_npu").npu, "set_deterministic_level")
    before = torch.are_deterministic_algorithms_enabled()
    with pytest.warns(UserWarning), AscendBackend("npu").deterministic():
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled() == before
    assert ("torch.use_deterministic_algorithms", True) in npu_sdk.calls


def test_reading_the_fingerprint_changes_nothing(npu_sdk) -> None:
    before = torch.are_deterministic_algorithms_enabled()
    facts = plugins.fingerprint("npu")
    assert npu_sdk.calls == []
    assert npu_sdk.deterministic_level is None  # the getter would have set it
    assert torch.are_deterministic_algorithms_enabled() == before
    assert facts["torch.deterministic_algorithms"] == before  # torch_npu's level shows here


def test_fingerprint_records_the_numerics_switches(npu_sdk, monkeypatch) -> None:
    npu_sdk.options["ACL_PRECISION_MODE"] = "allow_fp32_to_fp16"
    npu_sdk.inf_nan = False
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "0")
    facts = plugins.fingerprint("npu:0")
    assert facts["npu.torch_npu_version"] == "2.1.0.post99+FAKE"
    assert facts["npu.precision_mode"] == "allow_fp32_to_fp16"
    assert facts["npu.op_select_impl_mode"] == "unset"  # never set: the chip's default
    assert facts["npu.conv.allow_hf32"] is True
    assert facts["npu.matmul.allow_hf32"] is False
    assert facts["npu.inf_nan_mode"] is False
    assert facts["npu.allow_internal_format"] is True
    assert facts["npu.jit_compile"] is False
    assert facts["npu.device_name"] == "Ascend910B-FAKE"
    assert facts["env.INF_NAN_MODE_ENABLE"] == "0"
    assert facts["torch.version"] == torch.__version__  # precguard's own part is merged in


def test_an_unset_precision_mode_is_unset_not_unreadable(npu_sdk, monkeypatch) -> None:
    check = _checks()["env.ascend_precision_mode"]
    unset = check.func(CheckContext(device="npu"))
    assert unset.status == "warn"
    assert unset.evidence["npu.precision_mode"] == "unset"
    assert "is unset" in unset.summary and "could not be read" not in unset.summary

    def broken_getter(name: str) -> bytes:
        raise RuntimeError("ACL option store not initialised")

    monkeypatch.setattr(__import__("torch_npu")._C, "_npu_getOption", broken_getter)
    unreadable = check.func(CheckContext(device="npu"))
    assert unreadable.status == "warn" and "could not be read" in unreadable.summary
    assert unreadable.evidence["npu.precision_mode"] is None


def test_checks_name_the_pitfalls(npu_sdk) -> None:
    npu_sdk.options["ACL_PRECISION_MODE"] = "allow_fp32_to_fp16"
    npu_sdk.inf_nan = False
    ctx = CheckContext(device="npu")
    checks = _checks()
    precision = checks["env.ascend_precision_mode"].func(ctx)
    assert precision.status == "fail"
    assert "must_keep_origin_dtype" in precision.remedy
    assert checks["env.npu_conv_hf32"].func(ctx).status == "warn"  # on by default
    assert checks["env.npu_matmul_hf32"].func(ctx).status == "pass"
    saturation = checks["env.npu_saturation_mode"].func(ctx)
    assert saturation.status == "warn" and "emu:fp16-saturate" in saturation.remedy
    assert checks["env.npu_cpu_fallback"].func(ctx).status == "warn"
    assert checks["env.npu_internal_format"].func(ctx).status == "warn"
    npu_sdk.options["ACL_PRECISION_MODE"] = "must_keep_origin_dtype"
    assert checks["env.ascend_precision_mode"].func(ctx).status == "pass"


def test_checks_skip_other_devices_and_a_missing_sdk(no_npu_sdk: None) -> None:
    checks = _checks()
    assert checks["env.npu_conv_hf32"].func(CheckContext(device="cuda")).status == "skip"
    missing = checks["env.ascend_precision_mode"].func(CheckContext(device="npu"))
    assert missing.status == "skip" and "torch_npu is not installed" in missing.summary
    # environment-only checks still run without the SDK
    assert checks["env.npu_cpu_fallback"].func(CheckContext(device="npu")).status == "warn"


def test_backend_and_checks_reach_the_registry_through_the_hooks() -> None:
    assert plugins.registered("backends")["npu"].plugin == "ascend"
    ids = set(plugins.collect_checks())
    assert {"env.ascend_precision_mode", "env.npu_conv_hf32", "env.npu_saturation_mode"} <= ids


def test_to_host_casts_internal_formats_to_nd(npu_sdk) -> None:
    data = torch.arange(6.0).reshape(2, 3)
    nz = plugins.to_host(npu_sdk.tensor(data, npu_sdk.FORMAT_FRACTAL_NZ))
    assert torch.equal(nz, data)
    assert ("npu_format_cast", npu_sdk.FORMAT_ND) in npu_sdk.calls
    npu_sdk.calls.clear()
    nd = plugins.to_host(npu_sdk.tensor(data, npu_sdk.FORMAT_ND))
    assert torch.equal(nd, data) and not npu_sdk.calls


def test_vendor_state_records_the_overflow_flag_in_saturation_mode(npu_sdk, tmp_path) -> None:
    backend = AscendBackend("npu")
    npu_sdk.inf_nan = False
    npu_sdk.overflow_flag = True
    line = record_vendor_state(backend, tmp_path, 0)
    assert line == {
        "step": 0,
        "device": "npu",
        "state": {"inf_nan_mode": False, "overflow_flag": True},
    }
    written = (tmp_path / "rank0" / "vendor.jsonl").read_text().splitlines()
    assert [json.loads(text) for text in written] == [line]
    assert npu_sdk.overflow_flag is False  # read and cleared for the next step
    npu_sdk.inf_nan = True
    assert record_vendor_state(backend, tmp_path, 1) is None  # INF_NAN mode: inf shows itself
    assert len((tmp_path / "rank0" / "vendor.jsonl").read_text().splitlines()) == 1


@pytest.mark.parametrize(
    ("options", "matmul", "device_name", "expected"),
    [
        ({"ACL_PRECISION_MODE": "must_keep_origin_dtype"}, {}, "Ascend910B-FAKE", None),
        ({"ACL_PRECISION_MODE": "allow_fp32_to_fp16"}, {}, "Ascend910B-FAKE", "float16"),
        ({"ACL_PRECISION_MODE": "allow_mix_precision_bf16"}, {}, "Ascend910B-FAKE", "bfloat16"),
        ({}, {}, "Ascend910B-FAKE", None),  # unset on a 910B: dtypes are kept
        ({}, {}, "Ascend910A", "float16"),  # unset before 910B: allow_fp32_to_fp16
        ({}, {"allow_hf32": True}, "Ascend910B-FAKE", "hfloat32"),
        ({}, {"cube_math_type": 2}, "Ascend910B-FAKE", "float16"),  # USE_FP16
        ({}, {"cube_math_type": 3}, "Ascend910B-FAKE", "hfloat32"),  # USE_HF32
        # several lower precisions: the least precise one counts
        ({"ACL_PRECISION_MODE": "allow_fp32_to_fp16"}, {"allow_hf32": True}, "A", "float16"),
    ],
)
def test_compute_precision_follows_the_precision_switches(
    npu_sdk, monkeypatch, options, matmul, device_name, expected
) -> None:
    npu = __import__("torch_npu").npu
    npu_sdk.options.update(options)
    for name, value in matmul.items():
        monkeypatch.setattr(npu.matmul, name, value)
    monkeypatch.setattr(npu, "get_device_name", lambda index=0: device_name)
    calls = len(npu_sdk.calls)

    assert AscendBackend("npu:0").compute_dtype() == expected
    assert not [c for c in npu_sdk.calls[calls:] if "set" in c[0]]  # reading sets nothing
