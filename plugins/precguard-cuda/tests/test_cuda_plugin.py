"""precguard-cuda on this CPU-only machine: flags are readable, the device is not."""

from __future__ import annotations

import os

import pytest
import torch
from precguard_cuda import plugin as cuda_plugin
from precguard_cuda.backend import CudaBackend

from precguard import plugins
from precguard.checks.base import CheckContext


def _checks() -> dict:
    found: list = []
    cuda_plugin.precguard_register_checks(register=found.append)
    return {c.id: c for c in found}


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a GPU")
def test_unavailable_with_the_reason() -> None:
    ok, reason = plugins.get_backend("cuda:0").availability()
    assert not ok
    assert "built without CUDA" in reason or "no CUDA device" in reason


def test_fingerprint_has_every_switch() -> None:
    facts = plugins.fingerprint("cuda")
    for key in (
        "cuda.matmul.allow_tf32",
        "cuda.matmul.allow_fp16_reduced_precision_reduction",
        "cuda.matmul.allow_bf16_reduced_precision_reduction",
        "cuda.cudnn.allow_tf32",
        "cuda.cudnn.deterministic",
        "cuda.cudnn.benchmark",
        "cuda.sdp.flash",
        "cuda.sdp.math",
        "env.CUBLAS_WORKSPACE_CONFIG",
        "env.NVIDIA_TF32_OVERRIDE",
        "torch.float32_matmul_precision",
    ):
        assert key in facts, key
    assert plugins.fingerprint("cpu").keys().isdisjoint({"cuda.cudnn.allow_tf32"})


def test_deterministic_restores_flags_and_environment(monkeypatch) -> None:
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    before = torch.are_deterministic_algorithms_enabled()
    with CudaBackend("cuda").deterministic():
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
        assert torch.are_deterministic_algorithms_enabled()
    assert torch.are_deterministic_algorithms_enabled() == before
    assert torch.backends.cudnn.benchmark and not torch.backends.cudnn.deterministic
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_checks(monkeypatch) -> None:
    ctx = CheckContext(device="cuda")
    checks = _checks()
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    # torch.backends.cuda.matmul is a module proxy monkeypatch cannot restore: do it by hand
    before = (matmul.allow_tf32, cudnn.allow_tf32)
    try:
        matmul.allow_tf32 = True
        tf32 = checks["env.cuda_tf32"].func(ctx)
        assert tf32.status == "warn" and "set_float32_matmul_precision('highest')" in tf32.remedy
        matmul.allow_tf32 = False
        cudnn.allow_tf32 = False
        assert checks["env.cuda_tf32"].func(ctx).status == "pass"
    finally:
        matmul.allow_tf32, cudnn.allow_tf32 = before
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    assert checks["env.cuda_cublas_workspace"].func(ctx).status == "pass"
    reduced = checks["env.cuda_reduced_precision_reduction"]
    flags = (
        "allow_fp16_reduced_precision_reduction",
        "allow_bf16_reduced_precision_reduction",
        "allow_fp16_accumulation",
    )
    saved = {f: getattr(matmul, f) for f in flags}
    try:
        for flag in flags:
            setattr(matmul, flag, False)
        assert reduced.func(ctx).status == "pass"
        matmul.allow_bf16_reduced_precision_reduction = True  # torch's default
        finding = reduced.func(ctx)
        assert finding.status == "warn"
        assert "allow_bf16_reduced_precision_reduction" in finding.summary
    finally:
        for flag, value in saved.items():
            setattr(matmul, flag, value)
    assert checks["env.cuda_tf32"].func(CheckContext(device="cpu")).status == "skip"


def test_compute_precision_is_tf32_when_fp32_matmuls_may_use_it() -> None:
    before = torch.get_float32_matmul_precision()
    try:
        torch.set_float32_matmul_precision("highest")
        assert CudaBackend("cuda").compute_dtype() is None
        torch.set_float32_matmul_precision("high")  # what most training scripts set
        assert CudaBackend("cuda").compute_dtype() == "tfloat32"
    finally:
        torch.set_float32_matmul_precision(before)
