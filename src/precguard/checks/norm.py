"""``norm`` checks: every LayerNorm/RMSNorm-like module against fp64 on extreme inputs.

Normalisation is where low precision bites first: the variance of large
activations overflows fp16, the variance of small ones underflows to zero, a
missing eps turns a constant row into 0/0. Each norm module (found by type
and by behaviour: its output does not change when its input is scaled) runs
on the device and in fp64 on the CPU on the same hand-made rows.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn

from precguard.checks._lab import (
    NORM_TYPES,
    Lab,
    NotApplicable,
    finding,
    first_tensor,
    lab,
    rel_error,
    run_module,
)
from precguard.checks.base import Check, CheckContext, Finding

_EPS_ATTRS = ("eps", "variance_epsilon", "epsilon")


def norm_modules(bench: Lab) -> dict[str, tuple[nn.Module, torch.Tensor, str]]:
    """Norm-like modules of the model: name -> (module, sample input, how it was found)."""
    found: dict[str, tuple[nn.Module, torch.Tensor, str]] = {}
    for name, (mod, args, _kwargs) in bench.module_inputs().items():
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is None or not x.is_floating_point() or x.dim() < 2 or any(mod.children()):
            continue
        if isinstance(mod, NORM_TYPES) or "norm" in type(mod).__name__.lower():
            found[name] = (mod, x, "type")
        elif sum(p.numel() for p in mod.parameters()) <= 4 * x.shape[-1] and _scale_invariant(
            mod, x
        ):
            found[name] = (mod, x, "behaviour")
    return found


def _scale_invariant(mod: nn.Module, x: torch.Tensor) -> bool:
    try:
        m = copy.deepcopy(mod).double()
        with torch.no_grad():
            y1, y3 = first_tensor(m(x.double())), first_tensor(m(3.0 * x.double()))
    except Exception:
        return False
    if y1 is None or y3 is None or y1.shape != x.shape:
        return False
    moved = rel_error(y1, x.double()) > 1e-3
    return moved and rel_error(y3, y1) < 1e-9


def _eps_of(mod: nn.Module) -> float | None:
    for attr in _EPS_ATTRS:
        value = getattr(mod, attr, None)
        if isinstance(value, int | float):
            return float(value)
    return None


CASE_LABELS = {
    "typical": "typical rows (standard normal)",
    "constant_rows": "constant rows (variance 0)",
    "large": "large rows (|x| ~ 1e3; x**2 overflows fp16)",
    "near_dtype_max": "rows holding values near the dtype's max",
    "small": "small rows (|x| ~ 1e-4; x**2 underflows fp16)",
    "tiny": "tiny rows (near the dtype's smallest normal)",
}


def extreme_inputs(dtype: torch.dtype, sample: torch.Tensor) -> dict[str, torch.Tensor]:
    """Hand-made inputs shaped like ``sample``, exactly representable in ``dtype``."""
    gen = torch.Generator().manual_seed(1234)
    shape = sample.shape
    dim = shape[-1]
    info = torch.finfo(dtype)
    base = torch.randn(shape, generator=gen, dtype=torch.float64)
    constant = torch.ones(shape, dtype=torch.float64)
    steps = torch.arange(constant[..., :1].numel(), dtype=torch.float64).reshape(*shape[:-1], 1)
    near = base.clone()
    near[..., 0] = info.max / 4
    near[..., 1 % dim] = -info.max / 4
    cases = {
        "typical": base,
        "constant_rows": constant * (steps - steps.mean()),
        "large": base * 1e3,
        "near_dtype_max": near,
        "small": base * 1e-4,
        "tiny": base * max(1e-7, info.tiny * 16),
    }
    return {k: v.to(dtype).to(torch.float64) for k, v in cases.items()}


def extreme_inputs_check(ctx: CheckContext, tolerance: float | None = None) -> Finding:
    """Run each norm module on extreme inputs on the device and in fp64; compare."""
    bench = lab(ctx)
    cid = "norm.extreme_inputs"
    modules = norm_modules(bench)
    if not modules:
        raise NotApplicable("no LayerNorm/RMSNorm-like module found (by type or behaviour)")
    tol = tolerance if tolerance is not None else 4 * bench.eps
    failures: list[str] = []
    warnings: list[str] = []
    per_module: dict[str, Any] = {}
    for name, (mod, sample, how) in modules.items():
        eps = _eps_of(mod)
        result: dict[str, Any] = {"type": type(mod).__name__, "found_by": how, "eps": eps}
        smallest = float(
            torch.finfo(bench.compute_dtype).tiny * torch.finfo(bench.compute_dtype).eps
        )
        if eps is not None and eps <= 0:
            failures.append(f"{name}: eps = {eps}")
        elif eps is not None and eps < smallest / 2:
            # below the smallest subnormal: eps itself rounds to 0 in the compute dtype
            failures.append(f"{name}: eps = {eps:g} rounds to 0 in {bench.cname}")
        for case, x in extreme_inputs(bench.compute_dtype, sample).items():
            try:
                ref = first_tensor(
                    run_module(mod, (x,), {}, dtype=torch.float64, device=torch.device("cpu"))
                )
                got = first_tensor(
                    run_module(
                        mod,
                        (x,),
                        {},
                        dtype=bench.dtype,
                        device=bench.dev,
                        numerics=bench.device.numerics,
                    )
                )
            except Exception as exc:  # a norm that needs more than one input: note and go on
                result["not_rerun"] = f"{type(exc).__name__}: {exc}"
                break
            assert ref is not None and got is not None
            label = CASE_LABELS.get(case, case)
            if not torch.isfinite(got).all():
                result[case] = "nonfinite"
                failures.append(f"{name}: NaN/Inf on {label}")
                continue
            err = rel_error(got, ref)
            result[case] = err
            if err > 8 * tol:
                failures.append(f"{name}: error {err:.2g} vs fp64 on {label}")
            elif err > tol:
                warnings.append(f"{name}: error {err:.2g} vs fp64 on {label}")
        per_module[name] = result
    evidence = {
        "compute_dtype": bench.compute_dtype,
        "tolerance": tol,
        "modules": per_module,
    }
    remedy = (
        "Normalise in fp32 and cast once at the end, with a positive eps: "
        "`x32 = x.float(); y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps); "
        "return weight * y.to(x.dtype)` (eps around 1e-5/1e-6, never 0); on Ascend use the "
        "fused npu_rms_norm, which accumulates in fp32."
    )
    if failures:
        return finding(
            cid,
            "fail",
            f"{len(set(f.split(':')[0] for f in failures))} norm module(s) break on extreme "
            f"inputs: {failures[0]}",
            {**evidence, "failures": failures[:20]},
            remedy,
        )
    if warnings:
        return finding(
            cid,
            "warn",
            f"norm error above {tol:.2g} on extreme inputs: {warnings[0]}",
            {**evidence, "warnings": warnings[:20]},
            remedy,
        )
    worst = max(
        (v for r in per_module.values() for v in r.values() if isinstance(v, float)),
        default=0.0,
    )
    return finding(
        cid,
        "pass",
        f"{len(modules)} norm module(s) stay finite and within {tol:.2g} of fp64 on extreme "
        f"inputs (worst {worst:.2g})",
        evidence,
    )


CHECKS = [
    Check(
        "norm.extreme_inputs",
        "Each norm module vs fp64 on constant, large, tiny and near-limit rows; eps present.",
        extreme_inputs_check,
    ),
]
