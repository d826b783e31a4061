"""precguard-cambricon against the FAKE torch_mlu (conftest.py) and without it."""

from __future__ import annotations

import pytest
import torch
from precguard_cambricon import plugin as cambricon_plugin
from precguard_cambricon.backend import CambriconBackend

from precguard import plugins
from precguard.checks.base import CheckContext
from precguard.errors import DeviceUnavailableError
from precguard.runner import resolve_backend


def _checks() -> dict:
    found: list = []
    cambricon_plugin.precguard_register_checks(register=found.append)
    return {c.id: c for c in found}


def test_without_torch_mlu(no_mlu_sdk: None) -> None:
    backend = plugins.get_backend("mlu:0")
    assert isinstance(backend, CambriconBackend)
    assert backend.availability() == (False, "torch_mlu is not installed")
    with pytest.raises(DeviceUnavailableError, match="torch_mlu is not installed"):
        resolve_backend("mlu")
    assert _checks()["env.mlu_tf32"].func(CheckContext(device="mlu")).status == "skip"


def test_seeding_and_rng_state(mlu_sdk) -> None:
    backend = CambriconBackend("mlu")
    assert backend.availability() == (True, "")
    backend.manual_seed(7)
    assert ("mlu.manual_seed_all", 7) in mlu_sdk.calls
    state = backend.get_rng_state()
    backend.manual_seed(8)
    backend.set_rng_state(state)
    assert torch.equal(backend.get_rng_state(), state)


def test_fingerprint_reads_the_mlu_flags_not_the_cuda_ones(mlu_sdk, monkeypatch) -> None:
    monkeypatch.setenv("ENABLE_FALLBACK_TO_CPU", "1")
    facts = plugins.fingerprint("mlu")
    assert facts["mlu.torch_mlu_version"] == "1.24.0+FAKE"
    assert facts["mlu.cnnl.allow_tf32"] is True
    assert facts["mlu.cnnl.deterministic"] is False
    assert facts["mlu.matmul.allow_tf32"] is False
    assert facts["mlu.device_name"] == "MLU370-FAKE"
    assert facts["env.ENABLE_FALLBACK_TO_CPU"] == "1"
    assert not any(k.startswith("cuda.") for k in facts)


def test_deterministic_sets_cnnl_and_torch_and_restores_both(mlu_sdk) -> None:
    before = torch.are_deterministic_algorithms_enabled()
    with CambriconBackend("mlu").deterministic():
        assert torch.backends.cnnl.deterministic is True
        assert torch.are_deterministic_algorithms_enabled()
        assert plugins.fingerprint("mlu")["mlu.cnnl.deterministic"] is True
    assert torch.backends.cnnl.deterministic is False
    assert torch.are_deterministic_algorithms_enabled() == before


def test_checks(mlu_sdk, monkeypatch) -> None:
    ctx = CheckContext(device="mlu")
    checks = _checks()
    tf32 = checks["env.mlu_tf32"].func(ctx)
    assert tf32.status == "warn" and "torch.backends.cnnl.allow_tf32 = False" in tf32.remedy
    torch.backends.cnnl.allow_tf32 = False  # the fake, restored by monkeypatch
    assert checks["env.mlu_tf32"].func(ctx).status == "pass"
    assert checks["env.mlu_cpu_fallback"].func(CheckContext(device="npu")).status == "skip"


@pytest.mark.parametrize(
    ("fallback", "fail_fallback", "status"),
    [
        (None, None, "warn"),  # ENABLE_FALLBACK_TO_CPU is on by default
        ("1", None, "warn"),
        ("0", None, "pass"),
        ("OFF", None, "pass"),
        ("off", None, "pass"),
        ("0", "0", "pass"),
        ("0", "true", "pass"),  # only 1/ON/on turn the fail fallback on
        ("0", "1", "warn"),
        ("off", "ON", "warn"),
        ("OFF", "on", "warn"),
    ],
)
def test_cpu_fallback_reads_the_variables_as_torch_mlu_does(
    mlu_sdk, monkeypatch, fallback: str | None, fail_fallback: str | None, status: str
) -> None:
    for name, value in (
        ("ENABLE_FALLBACK_TO_CPU", fallback),
        ("ENABLE_MLU_FAIL_FALLBACK", fail_fallback),
    ):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    finding = _checks()["env.mlu_cpu_fallback"].func(CheckContext(device="mlu"))
    assert finding.status == status, finding.summary


def test_compute_precision_is_tf32_when_the_mlu_matmul_flag_is_on(mlu_sdk) -> None:
    backend = CambriconBackend("mlu")
    assert backend.compute_dtype() is None  # torch_mlu's default for matmuls
    torch.backends.mlu.matmul.allow_tf32 = True
    assert backend.compute_dtype() == "tfloat32"
