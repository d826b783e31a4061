"""``env.cuda_*`` checks: the NVIDIA switches that make a GPU run differ from an fp32 reference."""

from __future__ import annotations

from typing import Any

from precguard.checks.base import Check, CheckContext, Finding
from precguard_cuda.backend import CudaBackend


def _facts(ctx: CheckContext) -> dict[str, Any] | None:
    if ctx.device.split(":", 1)[0] != "cuda":
        return None
    return CudaBackend(ctx.device).fingerprint()


def _skip(check_id: str, ctx: CheckContext) -> Finding:
    return Finding(id=check_id, status="skip", summary=f"{ctx.device} is not a CUDA device")


def tf32(ctx: CheckContext) -> Finding:
    """fp32 matmuls and convolutions must not run as TF32 in a parity run."""
    facts = _facts(ctx)
    if facts is None:
        return _skip("env.cuda_tf32", ctx)
    import torch

    precision = torch.get_float32_matmul_precision()
    on = {
        "cuda.matmul.allow_tf32": facts["cuda.matmul.allow_tf32"],
        "cuda.cudnn.allow_tf32": facts["cuda.cudnn.allow_tf32"],
        "torch.float32_matmul_precision": precision,
        "env.NVIDIA_TF32_OVERRIDE": facts["env.NVIDIA_TF32_OVERRIDE"],
    }
    reduced = [
        k
        for k, v in on.items()
        if v is True or (k == "torch.float32_matmul_precision" and v != "highest")
    ]
    if on["env.NVIDIA_TF32_OVERRIDE"] == "0":
        reduced = []
    if not reduced:
        return Finding(
            id="env.cuda_tf32",
            status="pass",
            summary="fp32 matmul and conv run in fp32",
            evidence=on,
        )
    return Finding(
        id="env.cuda_tf32",
        status="warn",
        summary=f"fp32 work may run as TF32 (10-bit mantissa) on {ctx.device}: "
        + ", ".join(reduced),
        evidence=on,
        remedy="For parity with an fp32 reference: torch.set_float32_matmul_precision('highest'), "
        "torch.backends.cuda.matmul.allow_tf32 = False, torch.backends.cudnn.allow_tf32 = False "
        "(or NVIDIA_TF32_OVERRIDE=0 for the whole process).",
    )


def reduced_precision_reduction(ctx: CheckContext) -> Finding:
    """fp16/bf16 matmuls may reduce split-K partial sums in fp16/bf16."""
    facts = _facts(ctx)
    cid = "env.cuda_reduced_precision_reduction"
    if facts is None:
        return _skip(cid, ctx)
    keys = (
        "cuda.matmul.allow_fp16_reduced_precision_reduction",
        "cuda.matmul.allow_bf16_reduced_precision_reduction",
        "cuda.matmul.allow_fp16_accumulation",
    )
    evidence = {k: facts[k] for k in keys}
    on = [k.rsplit(".", 1)[1] for k in keys if facts[k]]
    if not on:
        return Finding(
            id=cid,
            status="pass",
            summary="low-precision matmuls reduce in fp32",
            evidence=evidence,
        )
    return Finding(
        id=cid,
        status="warn",
        summary=f"fp16/bf16 matmuls on {ctx.device} may reduce partial sums in low precision "
        f"({', '.join(on)})",
        evidence=evidence,
        remedy="When chasing an fp16/bf16 difference, set "
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction = False and "
        "allow_bf16_reduced_precision_reduction = False and compare again.",
    )


def cublas_workspace(ctx: CheckContext) -> Finding:
    """Deterministic algorithms on CUDA need CUBLAS_WORKSPACE_CONFIG set before CUDA starts."""
    facts = _facts(ctx)
    cid = "env.cuda_cublas_workspace"
    if facts is None:
        return _skip(cid, ctx)
    import torch

    evidence = {
        "env.CUBLAS_WORKSPACE_CONFIG": facts["env.CUBLAS_WORKSPACE_CONFIG"],
        "torch.deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "cuda.cudnn.deterministic": facts["cuda.cudnn.deterministic"],
        "cuda.cudnn.benchmark": facts["cuda.cudnn.benchmark"],
    }
    problems = []
    if evidence["env.CUBLAS_WORKSPACE_CONFIG"] not in (":4096:8", ":16:8"):
        problems.append("CUBLAS_WORKSPACE_CONFIG is not :4096:8 or :16:8")
    if evidence["cuda.cudnn.benchmark"]:
        problems.append("cudnn.benchmark is on (algorithm choice varies run to run)")
    if not problems:
        return Finding(
            id=cid,
            status="pass",
            summary="cuBLAS and cuDNN are set up for repeatable runs",
            evidence=evidence,
        )
    return Finding(
        id=cid,
        status="warn",
        summary=f"runs on {ctx.device} may not repeat bitwise: " + "; ".join(problems),
        evidence=evidence,
        remedy="Export CUBLAS_WORKSPACE_CONFIG=:4096:8 before the process starts, set "
        "torch.backends.cudnn.benchmark = False and deterministic = True, or run under "
        "precguard's `with backend.deterministic():`.",
    )


CHECKS: list[Check] = [
    Check("env.cuda_tf32", "fp32 matmul/conv are not running as TF32.", tf32, needs_target=False),
    Check(
        "env.cuda_reduced_precision_reduction",
        "fp16/bf16 matmuls reduce in fp32.",
        reduced_precision_reduction,
        needs_target=False,
    ),
    Check(
        "env.cuda_cublas_workspace",
        "cuBLAS workspace and cuDNN autotuning allow repeatable runs.",
        cublas_workspace,
        needs_target=False,
    ),
]
