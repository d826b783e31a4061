"""precguard-cambricon against the FAKE torch_mlu (tests/plugins/fakes.py) and without it."""

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
    assert facts["mlu.matmul.allow_tf32"] is False
    assert facts["mlu.device_name"] == "MLU370-FAKE"
    assert facts["env.ENABLE_FALLBACK_TO_CPU"] == "1"
    assert not any(k.startswith("cuda.") for k in facts)


def test_checks(mlu_sdk, monkeypatch) -> None:
    ctx = CheckContext(device="mlu")
    checks = _checks()
    tf32 = checks["env.mlu_tf32"].func(ctx)
    assert tf32.status == "warn" and "torch.backends.cnnl.allow_tf32 = False" in tf32.remedy
    torch.backends.cnnl.allow_tf32 = False  # the fake, restored by monkeypatch
    assert checks["env.mlu_tf32"].func(ctx).status == "pass"
    monkeypatch.delenv("ENABLE_FALLBACK_TO_CPU", raising=False)
    assert checks["env.mlu_cpu_fallback"].func(ctx).status == "warn"
    monkeypatch.setenv("ENABLE_FALLBACK_TO_CPU", "0")
    assert checks["env.mlu_cpu_fallback"].func(ctx).status == "pass"
    assert checks["env.mlu_cpu_fallback"].func(CheckContext(device="npu")).status == "skip"
