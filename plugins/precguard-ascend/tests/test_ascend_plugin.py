"""precguard-ascend against the FAKE torch_npu (tests/plugins/fakes.py) and without it."""

from __future__ import annotations

import os

import pytest
import torch
from precguard_ascend import plugin as ascend_plugin
from precguard_ascend.backend import AscendBackend

from precguard import plugins
from precguard.checks.base import CheckContext
from precguard.errors import DeviceUnavailableError
from precguard.runner import resolve_backend
from tests.plugins.fakes import FORMAT_FRACTAL_NZ, FORMAT_ND, FakeNpuTensor


def _checks() -> dict:
    return {c.id: c for c in _registered()}


def _registered() -> list:
    found = []
    ascend_plugin.precguard_register_checks(register=found.append)
    return found


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


def test_deterministic_sets_and_restores(npu_sdk, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HCCL_DETERMINISTIC", raising=False)
    before = torch.are_deterministic_algorithms_enabled()
    with AscendBackend("npu").deterministic():
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["HCCL_DETERMINISTIC"] == "true"
        assert npu_sdk.deterministic_level == 1
    assert torch.are_deterministic_algorithms_enabled() == before
    assert "HCCL_DETERMINISTIC" not in os.environ
    assert npu_sdk.deterministic_level == 0


def test_fingerprint_records_the_numerics_switches(npu_sdk, monkeypatch) -> None:
    npu_sdk.options["ACL_PRECISION_MODE"] = "allow_fp32_to_fp16"
    npu_sdk.inf_nan = False
    monkeypatch.setenv("INF_NAN_MODE_ENABLE", "0")
    facts = plugins.fingerprint("npu:0")
    assert facts["npu.torch_npu_version"] == "2.1.0.post99+FAKE"
    assert facts["npu.precision_mode"] == "allow_fp32_to_fp16"
    assert facts["npu.conv.allow_hf32"] is True
    assert facts["npu.matmul.allow_hf32"] is False
    assert facts["npu.inf_nan_mode"] is False
    assert facts["npu.allow_internal_format"] is True
    assert facts["npu.jit_compile"] is False
    assert facts["npu.device_name"] == "Ascend910B-FAKE"
    assert facts["env.INF_NAN_MODE_ENABLE"] == "0"
    assert facts["torch.version"] == torch.__version__  # the cpu plugin's part is merged in


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


def test_checks_reach_the_registry_through_the_hook() -> None:
    ids = set(plugins.collect_checks())
    assert {"env.ascend_precision_mode", "env.npu_conv_hf32", "env.npu_saturation_mode"} <= ids


def test_to_host_casts_internal_formats_to_nd(npu_sdk) -> None:
    data = torch.arange(6.0).reshape(2, 3)
    nz = plugins.to_host(FakeNpuTensor(data, FORMAT_FRACTAL_NZ))
    assert torch.equal(nz, data)
    assert ("npu_format_cast", FORMAT_ND) in npu_sdk.calls
    npu_sdk.calls.clear()
    nd = plugins.to_host(FakeNpuTensor(data, FORMAT_ND))
    assert torch.equal(nd, data) and not npu_sdk.calls
    assert plugins.to_host(torch.ones(2)) is None  # CPU tensors need no plugin


def test_vendor_dump_records_the_overflow_flag_in_saturation_mode(npu_sdk, tmp_path) -> None:
    npu_sdk.inf_nan = False
    npu_sdk.overflow_flag = True
    lines = plugins.vendor_dump("npu", 0, tmp_path)
    assert lines == [
        {
            "step": 0,
            "plugin": "ascend",
            "state": {"inf_nan_mode": False, "overflow_flag": True},
        }
    ]
    assert (tmp_path / "rank0" / "vendor.jsonl").read_text().count("\n") == 1
    assert npu_sdk.overflow_flag is False  # read and cleared for the next step
    npu_sdk.inf_nan = True
    assert plugins.vendor_dump("npu", 1, tmp_path) == []  # INF_NAN mode: inf shows itself
