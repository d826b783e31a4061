"""``env.ascend_*`` / ``env.npu_*`` checks: Ascend switches that change numbers silently."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from precguard.checks.base import Check, CheckContext, Finding
from precguard_ascend.backend import AscendBackend
from precguard_ascend.sdk import UNSET

#: precision modes that let fp32 ops run in fp16 (or mixed) behind the model's back
LOWERING_MODES = frozenset(
    {"allow_fp32_to_fp16", "force_fp16", "allow_mix_precision", "allow_mix_precision_fp16",
     "allow_mix_precision_bf16", "force_lowerprecision"}
)  # fmt: skip


def _facts(ctx: CheckContext) -> dict[str, Any] | None:
    if ctx.device.split(":", 1)[0] != "npu":
        return None
    return AscendBackend(ctx.device).fingerprint()


def _guarded(check_id: str, needs_sdk: bool = True) -> Callable[..., Any]:
    """Skip devices that are not NPUs, and (if ``needs_sdk``) machines without torch_npu."""

    def wrap(body: Callable[[CheckContext, dict[str, Any]], Finding]) -> Callable[..., Finding]:
        def check(ctx: CheckContext) -> Finding:
            facts = _facts(ctx)
            if facts is None:
                return Finding(id=check_id, status="skip", summary=f"{ctx.device} is not an NPU")
            if needs_sdk and facts["npu.torch_npu_version"] is None:
                return Finding(
                    id=check_id,
                    status="skip",
                    summary="torch_npu is not installed; the setting cannot be read",
                )
            return body(ctx, facts)

        check.__doc__ = body.__doc__
        return check

    return wrap


@_guarded("env.ascend_precision_mode")
def precision_mode(ctx: CheckContext, facts: dict[str, Any]) -> Finding:
    """ACL_PRECISION_MODE must keep fp32 ops in fp32 for a parity run."""
    mode = facts["npu.precision_mode"]
    evidence = {"npu.precision_mode": mode, "npu.device_name": facts["npu.device_name"]}
    remedy = (
        "Set it explicitly before the first NPU op: "
        "torch.npu.set_option({'ACL_PRECISION_MODE': 'must_keep_origin_dtype'})."
    )
    if mode is None:
        return Finding(
            id="env.ascend_precision_mode",
            status="warn",
            summary="ACL_PRECISION_MODE could not be read from this torch_npu",
            evidence=evidence,
            remedy=remedy,
        )
    if mode == UNSET:
        return Finding(
            id="env.ascend_precision_mode",
            status="warn",
            summary="ACL_PRECISION_MODE is unset: the chip's default applies, which is "
            "allow_fp32_to_fp16 (fp32 ops run in fp16) on chips before the Ascend 910B",
            evidence=evidence,
            remedy=remedy,
        )
    if str(mode) in LOWERING_MODES:
        return Finding(
            id="env.ascend_precision_mode",
            status="fail",
            summary=f"ACL_PRECISION_MODE is {mode}: ops the model runs in fp32 may run in fp16",
            evidence=evidence,
            remedy="torch.npu.set_option({'ACL_PRECISION_MODE': 'must_keep_origin_dtype'}) "
            "before the first NPU op, then record again.",
        )
    return Finding(
        id="env.ascend_precision_mode",
        status="pass",
        summary=f"ACL_PRECISION_MODE is {mode}",
        evidence=evidence,
    )


def _hf32(check_id: str, key: str, what: str, switch: str) -> Callable[..., Finding]:
    @_guarded(check_id)
    def check(ctx: CheckContext, facts: dict[str, Any]) -> Finding:
        value = facts[key]
        evidence = {key: value}
        if value:
            return Finding(
                id=check_id,
                status="warn",
                summary=f"fp32 {what} on {ctx.device} may run as HF32 (reduced mantissa)",
                evidence=evidence,
                remedy=f"For parity with an fp32 reference set {switch} = False.",
            )
        return Finding(
            id=check_id, status="pass", summary=f"fp32 {what} run in fp32", evidence=evidence
        )

    return check


conv_hf32 = _hf32(
    "env.npu_conv_hf32", "npu.conv.allow_hf32", "convolutions", "torch.npu.conv.allow_hf32"
)
matmul_hf32 = _hf32(
    "env.npu_matmul_hf32", "npu.matmul.allow_hf32", "matmuls", "torch.npu.matmul.allow_hf32"
)


@_guarded("env.npu_saturation_mode")
def saturation_mode(ctx: CheckContext, facts: dict[str, Any]) -> Finding:
    """Saturation mode clamps overflow to ±max and NaN to 0, hiding both from inf/NaN checks."""
    inf_nan = facts["npu.inf_nan_mode"]
    evidence = {
        "npu.inf_nan_mode": inf_nan,
        "env.INF_NAN_MODE_ENABLE": facts["env.INF_NAN_MODE_ENABLE"],
        "env.INF_NAN_MODE_FORCE_DISABLE": facts["env.INF_NAN_MODE_FORCE_DISABLE"],
    }
    if inf_nan is False:
        return Finding(
            id="env.npu_saturation_mode",
            status="warn",
            summary=f"{ctx.device} runs in saturation mode: overflow becomes ±max and NaN "
            "becomes 0, so recordings show no inf/NaN where an overflow happened",
            evidence=evidence,
            remedy="Where the chip supports it, set INF_NAN_MODE_ENABLE=1 before launch; "
            "otherwise read the overflow flag precguard records per step in "
            "rank*/vendor.jsonl, and reproduce on the CPU with --device emu:fp16-saturate.",
        )
    return Finding(
        id="env.npu_saturation_mode",
        status="pass" if inf_nan else "warn",
        summary="INF_NAN mode: overflow shows as inf/NaN"
        if inf_nan
        else "the overflow mode could not be read",
        evidence=evidence,
    )


@_guarded("env.npu_cpu_fallback", needs_sdk=False)
def cpu_fallback(ctx: CheckContext, facts: dict[str, Any]) -> Finding:
    """Unsupported ops silently run on the CPU unless TORCH_NPU_FALLBACK_CPU_DISABLE=1."""
    value = facts["env.TORCH_NPU_FALLBACK_CPU_DISABLE"]
    evidence = {"env.TORCH_NPU_FALLBACK_CPU_DISABLE": value}
    if value == "1":
        return Finding(
            id="env.npu_cpu_fallback",
            status="pass",
            summary="CPU fallback is disabled: unsupported ops raise",
            evidence=evidence,
        )
    return Finding(
        id="env.npu_cpu_fallback",
        status="warn",
        summary="ops torch_npu does not support run silently on the CPU (another kernel, "
        "another precision)",
        evidence=evidence,
        remedy="Run once with TORCH_NPU_FALLBACK_CPU_DISABLE=1 to see which ops fall back.",
    )


@_guarded("env.npu_internal_format")
def internal_format(ctx: CheckContext, facts: dict[str, Any]) -> Finding:
    """Private formats (NZ, 5HD) change kernels and must be cast to ND before dumping."""
    value = facts["npu.allow_internal_format"]
    evidence = {"npu.allow_internal_format": value}
    if value:
        return Finding(
            id="env.npu_internal_format",
            status="warn",
            summary="internal formats are allowed: tensors may live in NZ/5HD layouts with "
            "different kernels than ND",
            evidence=evidence,
            remedy="torch.npu.config.allow_internal_format = False for parity runs "
            "(precguard casts saved tensors to ND either way).",
        )
    return Finding(
        id="env.npu_internal_format",
        status="pass",
        summary="internal formats are off (ND everywhere)",
        evidence=evidence,
    )


def _check(check_id: str, description: str, func: Callable[..., Finding]) -> Check:
    return Check(check_id, description, func, needs_target=False)


CHECKS: list[Check] = [
    _check("env.ascend_precision_mode", "fp32 ops are not lowered to fp16.", precision_mode),
    _check("env.npu_conv_hf32", "fp32 convolutions are not run as HF32.", conv_hf32),
    _check("env.npu_matmul_hf32", "fp32 matmuls are not run as HF32.", matmul_hf32),
    _check("env.npu_saturation_mode", "Overflow is visible as inf/NaN.", saturation_mode),
    _check("env.npu_cpu_fallback", "No op silently falls back to the CPU.", cpu_fallback),
    _check("env.npu_internal_format", "Tensors stay in plain ND format.", internal_format),
]
