"""``env.mlu_*`` checks: Cambricon switches that change numbers silently."""

from __future__ import annotations

from typing import Any

from precguard.checks.base import Check, CheckContext, Finding
from precguard_cambricon.backend import FAIL_FALLBACK_ON, FALLBACK_OFF, CambriconBackend


def _facts(ctx: CheckContext) -> dict[str, Any] | None:
    if ctx.device.split(":", 1)[0] != "mlu":
        return None
    return CambriconBackend(ctx.device).fingerprint()


def tf32(ctx: CheckContext) -> Finding:
    """fp32 matmuls and convolutions must not run as TF32 in a parity run."""
    facts = _facts(ctx)
    cid = "env.mlu_tf32"
    if facts is None:
        return Finding(id=cid, status="skip", summary=f"{ctx.device} is not an MLU")
    if facts["mlu.torch_mlu_version"] is None:
        return Finding(id=cid, status="skip", summary="torch_mlu is not installed")
    keys = ("mlu.matmul.allow_tf32", "mlu.cnnl.allow_tf32", "mlu.custom.allow_tf32")
    evidence = {k: facts[k] for k in keys}
    evidence["env.TORCH_ALLOW_TF32_CNMATMUL_OVERRIDE"] = facts[
        "env.TORCH_ALLOW_TF32_CNMATMUL_OVERRIDE"
    ]
    on = [k for k in keys if facts[k]]
    if not on:
        return Finding(id=cid, status="pass", summary="fp32 work runs in fp32", evidence=evidence)
    return Finding(
        id=cid,
        status="warn",
        summary=f"fp32 work on {ctx.device} may run as TF32: {', '.join(on)}",
        evidence=evidence,
        remedy="For parity set torch.backends.mlu.matmul.allow_tf32 = False and "
        "torch.backends.cnnl.allow_tf32 = False (the torch.backends.cuda/cudnn flags do "
        "nothing on MLU).",
    )


def cpu_fallback(ctx: CheckContext) -> Finding:
    """Unsupported or failing ops run on the CPU unless the fallback variables say no.

    ``ENABLE_FALLBACK_TO_CPU`` is on unless set to 0/OFF/off;
    ``ENABLE_MLU_FAIL_FALLBACK`` is off unless set to 1/ON/on.
    """
    facts = _facts(ctx)
    cid = "env.mlu_cpu_fallback"
    if facts is None:
        return Finding(id=cid, status="skip", summary=f"{ctx.device} is not an MLU")
    evidence = {
        "env.ENABLE_FALLBACK_TO_CPU": facts["env.ENABLE_FALLBACK_TO_CPU"],
        "env.ENABLE_MLU_FAIL_FALLBACK": facts["env.ENABLE_MLU_FAIL_FALLBACK"],
    }
    fallback = evidence["env.ENABLE_FALLBACK_TO_CPU"] not in FALLBACK_OFF
    fail_fallback = evidence["env.ENABLE_MLU_FAIL_FALLBACK"] in FAIL_FALLBACK_ON
    if not fallback and not fail_fallback:
        return Finding(
            id=cid,
            status="pass",
            summary="CPU fallback is off: unsupported ops raise",
            evidence=evidence,
        )
    return Finding(
        id=cid,
        status="warn",
        summary="ops torch_mlu does not support may run silently on the CPU"
        if fallback
        else "ops that fail on the MLU are run again silently on the CPU",
        evidence=evidence,
        remedy="Run once with ENABLE_FALLBACK_TO_CPU=0 and ENABLE_MLU_FAIL_FALLBACK=0 to see "
        "which ops fall back.",
    )


CHECKS: list[Check] = [
    Check("env.mlu_tf32", "fp32 matmul/conv are not running as TF32.", tf32, needs_target=False),
    Check(
        "env.mlu_cpu_fallback",
        "No op silently falls back to the CPU.",
        cpu_fallback,
        needs_target=False,
    ),
]
