"""``ops`` checks: the model's own (non-torch.nn) leaf modules on the device vs fp64.

Custom modules are where ports go wrong: a hand-written kernel, a fused op
that a vendor replaced, a function that silently upcasts on one chip and not
on another. Each custom leaf module is re-run on the inputs it received in a
real forward, once on the device and once in fp64 on the CPU.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from precguard.checks._lab import NotApplicable, finding, flatten, lab, rel_error, run_module
from precguard.checks.base import Check, CheckContext, Finding


def is_custom(module: nn.Module) -> bool:
    """True for modules whose class is not torch's own (``torch.nn.*``)."""
    return not type(module).__module__.startswith("torch.")


def _float_leaves(value: Any) -> list[torch.Tensor]:
    return [t for _, t in flatten(value) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def custom_modules(ctx: CheckContext, tolerance: float | None = None, limit: int = 64) -> Finding:
    """Each custom leaf module on its captured inputs: device vs fp64."""
    bench = lab(ctx)
    cid = "ops.custom_modules"
    tol = tolerance if tolerance is not None else 8 * bench.eps
    results: dict[str, Any] = {}
    failures: list[tuple[str, float]] = []
    tried = 0
    for name, (mod, args, kwargs) in bench.module_inputs().items():
        if name == "root" or any(mod.children()) or not is_custom(mod):
            continue
        if tried >= limit:
            break
        tried += 1
        ref = _float_leaves(
            run_module(mod, args, kwargs, dtype=torch.float64, device=torch.device("cpu"))
        )
        got = _float_leaves(
            run_module(
                mod,
                args,
                kwargs,
                dtype=bench.dtype,
                device=bench.dev,
                numerics=bench.device.numerics,
            )
        )
        if not ref or len(ref) != len(got):
            continue
        err = max(rel_error(g, r) for g, r in zip(got, ref, strict=True))
        results[name] = {"type": type(mod).__name__, "rel_error_vs_fp64": err}
        if err > tol:
            failures.append((name, err))
    if not tried:
        raise NotApplicable("the model has no custom (non-torch.nn) leaf module")
    evidence = {"compute_dtype": bench.compute_dtype, "tolerance": tol, "modules": results}
    if failures:
        failures.sort(key=lambda f: -f[1])
        name, err = failures[0]
        return finding(
            cid,
            "fail",
            f"{len(failures)} custom module(s) exceed {tol:.2g} relative error vs fp64 on "
            f"{ctx.device}; worst {name} ({type(bench.module_inputs()[name][0]).__name__}) "
            f"at {err:.3g}",
            {**evidence, "failing": [f[0] for f in failures]},
            f"Look inside {name}: compute its reductions, exponentials and angle arithmetic in "
            "fp32 and cast the result once; replay it with `precguard replay` to confirm the "
            "local error, and compare the vendor's fused kernel for it against this module.",
        )
    worst = max((r["rel_error_vs_fp64"] for r in results.values()), default=0.0)
    return finding(
        cid,
        "pass",
        f"{len(results)} custom leaf module(s) stay within {tol:.2g} of fp64 on {ctx.device} "
        f"(worst {worst:.2g})",
        evidence,
    )


CHECKS = [
    Check(
        "ops.custom_modules",
        "Every custom (non-torch.nn) leaf module on its captured inputs: device vs fp64.",
        custom_modules,
    ),
]
