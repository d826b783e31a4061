"""``env`` checks: the environment facts that change numbers, device vs reference vs golden.

Vendor plugins add their own ``env.*`` checks (precision modes, TF32/HF32,
saturation mode) through the same hook; checklists pick them all up with the
entry ``env.*``.
"""

from __future__ import annotations

from typing import Any

import torch

from precguard.checks.base import Check, CheckContext, Finding, finding

#: fingerprint keys whose difference matters even when the devices differ
_ALWAYS_COMPARE = ("torch.version", "torch.float32_matmul_precision", "torch.default_dtype")


def _diff(a: dict[str, Any], b: dict[str, Any]) -> dict[str, list[Any]]:
    return {k: [a[k], b[k]] for k in sorted(set(a) & set(b)) if a[k] != b[k]}


def fingerprint(ctx: CheckContext) -> Finding:
    """Compare the environment fingerprint of device, reference and (if given) the golden."""
    from precguard import plugins

    cid = "env.fingerprint"
    dev = plugins.fingerprint(ctx.device)
    ref = plugins.fingerprint(ctx.reference)
    evidence: dict[str, Any] = {
        "device": dev,
        "differs_device_vs_reference": _diff(dev, ref),
        "only_on_device": sorted(set(dev) - set(ref)),
    }
    notes: list[str] = []
    if ctx.golden is not None:
        from precguard.dump.reader import load_run

        golden = load_run(ctx.golden).manifest
        gdiff = _diff(dev, golden.fingerprint)
        evidence["golden_device"] = golden.device
        evidence["differs_device_vs_golden"] = gdiff
        evidence["golden_keys_compared"] = len(set(dev) & set(golden.fingerprint))
        if golden.torch_version != torch.__version__:
            gdiff.setdefault("torch.version", [torch.__version__, golden.torch_version])
        if not golden.fingerprint:
            # nothing to compare is not "no difference": say so, and say what was compared
            notes.append(
                "the golden recording has no environment fingerprint (its manifest's "
                "fingerprint is empty), so only its torch version was compared"
            )
        if gdiff:
            keys = ", ".join(sorted(gdiff)[:4])
            notes.append(f"differs from the golden's recording environment in {keys}")
    shared = {
        k: v for k, v in evidence["differs_device_vs_reference"].items() if k in _ALWAYS_COMPARE
    }
    if shared:
        notes.append(f"device and reference differ in {', '.join(sorted(shared))}")
    if notes:
        return finding(
            cid,
            "warn",
            "; ".join(notes),
            evidence,
            "Make the environments match where the difference is not the point of the "
            "comparison: same torch and vendor versions, torch.set_float32_matmul_precision"
            "('highest'), same default dtype; re-record the golden if it is stale or has no "
            "fingerprint (`precguard record` writes one).",
        )
    return finding(
        cid,
        "pass",
        f"no numerics-relevant environment difference between {ctx.device} and {ctx.reference}"
        + (" and the golden" if ctx.golden is not None else ""),
        evidence,
    )


def determinism(ctx: CheckContext) -> Finding:
    """Report whether deterministic algorithms are on where the device needs them."""
    from precguard import plugins

    cid = "env.determinism"
    backend = ctx.backend()
    fp = plugins.fingerprint(ctx.device)
    flags = {k: v for k, v in fp.items() if "determin" in k.lower()}
    enabled = torch.are_deterministic_algorithms_enabled()
    evidence = {"torch.deterministic_algorithms": enabled, "device_flags": flags}
    host_only = backend.torch_device().type == "cpu"
    off = [k for k, v in flags.items() if v in (False, "0", "false", "False", None)]
    if enabled and not off:
        return finding(cid, "pass", "deterministic algorithms are enabled", evidence)
    if host_only:
        return finding(
            cid,
            "pass",
            f"{ctx.device} runs on the CPU, whose kernels are run-to-run deterministic here",
            evidence,
        )
    return finding(
        cid,
        "warn",
        f"deterministic algorithms are off on {ctx.device}"
        + (f" ({', '.join(off)})" if off else ""),
        evidence,
        "For comparison runs turn determinism on: torch.use_deterministic_algorithms(True) "
        "(CUDA also needs CUBLAS_WORKSPACE_CONFIG=:4096:8 before the first CUDA call; Ascend: "
        "torch_npu.npu.set_deterministic_level and HCCL_DETERMINISTIC=true), or use "
        "`with backend.deterministic():` from precguard.",
    )


CHECKS = [
    Check(
        "env.fingerprint",
        "Environment facts that change numerics: device vs reference vs golden manifest.",
        fingerprint,
        needs_target=False,
    ),
    Check(
        "env.determinism",
        "Deterministic algorithms and the device's determinism switches.",
        determinism,
        needs_target=False,
    ),
]
