"""``ops`` checks: the model's own (non-torch.nn) leaf modules on the device vs fp64.

Custom modules are where ports go wrong: a hand-written kernel, a fused op
that a vendor replaced, a function that silently upcasts on one chip and not
on another. Each custom leaf module is re-run on the inputs it received in a
real forward, once on the device and once under the fp64 oracle
(:mod:`precguard.oracle`: the module's own downcasts run in fp64 there too).
Both runs are op-check's (:func:`precguard.opcheck.measure.run_on_device` and
the oracle), the same ones ``precguard op-check`` sweeps over lengths.
"""

from __future__ import annotations

from typing import Any

import torch

from precguard.checks._lab import flatten, is_custom, lab, rel_error, run_module
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding
from precguard.numerics import precision_class
from precguard.opcheck.measure import run_on_device
from precguard.oracle import run_in_fp64


def _float_leaves(value: Any) -> list[torch.Tensor]:
    return [t for _, t in flatten(value) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def custom_modules(ctx: CheckContext, tolerance: float | None = None, limit: int = 64) -> Finding:
    """Each custom leaf module on its captured inputs: device vs the fp64 oracle."""
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
        try:
            ref = _float_leaves(run_in_fp64(mod, *args, **kwargs))
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
        except Exception as exc:  # one module that cannot be re-run alone must not stop the rest
            results[name] = {
                "type": type(mod).__name__,
                "not_rerun": f"{type(exc).__name__}: {exc}",
            }
            continue
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
    measured = [r["rel_error_vs_fp64"] for r in results.values() if "rel_error_vs_fp64" in r]
    skipped = len(results) - len(measured)
    if not measured:
        raise NotApplicable(f"none of the {skipped} custom leaf module(s) could be re-run alone")
    return finding(
        cid,
        "pass",
        f"{len(measured)} custom leaf module(s) stay within {tol:.2g} of fp64 on {ctx.device} "
        f"(worst {max(measured):.2g})"
        + (f"; {skipped} could not be re-run alone (see evidence)" if skipped else ""),
        evidence,
    )


#: op -> function of one fp32 (or fp64) tensor; each is precision-sensitive
PROBED_OPS: dict[str, Any] = {
    "softmax": lambda x: torch.softmax(x, dim=-1),
    "log_softmax": lambda x: torch.log_softmax(x, dim=-1),
    "layer_norm": lambda x: torch.nn.functional.layer_norm(x, x.shape[-1:]),
    "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 1),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 1),
    "pow": lambda x: x.pow(2),
    "sum": lambda x: x.sum(-1),
    "mean": lambda x: x.mean(-1),
    "cumsum": lambda x: x.cumsum(-1),
    "matmul": lambda x: x @ x.transpose(-1, -2),
    "sin": torch.sin,
    "cos": torch.cos,
    # long reductions expose low-precision accumulation, not just rounding
    "sum_4096": lambda x: x.reshape(-1, 4096).sum(-1),
    "matmul_k4096": lambda x: x.reshape(-1, 4096) @ x.reshape(-1, 4096).transpose(0, 1),
}


_UNIT = {"float32": 2.0**-24, "float16": 2.0**-11, "bfloat16": 2.0**-8, "below bfloat16": 1.0}


def effective_precision(err: float) -> str:
    """Name the precision a relative error vs fp64 points to (fp32, fp16, bf16 or worse):
    :func:`precguard.numerics.precision_class`, the format nearest in bits."""
    return precision_class(err)


def op_precision(ctx: CheckContext) -> Finding:
    """Probe single ops on the device against fp64: which run below the device's precision."""
    bench = lab(ctx)
    cid = "ops.op_precision"
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(16, 1024, generator=gen)
    expected = effective_precision(0.5 * bench.eps) if bench.eps > 1e-6 else "float32"
    results: dict[str, Any] = {}
    lowered: list[str] = []
    for name, fn in PROBED_OPS.items():
        want = run_in_fp64(fn, x)
        got = run_on_device(
            fn, (x,), dtype=bench.dtype, device=bench.dev, numerics=bench.device.numerics
        )
        err = rel_error(got, want)
        precision = effective_precision(err)
        flushed = int(((got.detach().cpu() == 0) & (want != 0)).sum())
        results[name] = {"rel_error_vs_fp64": err, "behaves_like": precision, "flushed": flushed}
        if _UNIT[precision] > _UNIT[expected]:
            lowered.append(name)
    evidence = {"device_compute_dtype": bench.compute_dtype, "ops": results}
    if lowered:
        worst = lowered[0]
        return finding(
            cid,
            "fail",
            f"{', '.join(lowered)} {'loses' if len(lowered) == 1 else 'lose'} more precision "
            f"on {ctx.device} than {expected} rounding explains (behaving like "
            f"{results[worst]['behaves_like']}"
            + ("; long reductions point to low-precision accumulation" if "4096" in worst else "")
            + (
                f"; {results[worst]['flushed']} small results flushed to zero"
                if results[worst]["flushed"]
                else ""
            )
            + ")",
            {**evidence, "lowered": lowered},
            "An op runs below the precision of the rest of the device: a vendor precision mode "
            "(Ascend ACL_PRECISION_MODE=allow_fp32_to_fp16 / cube_math_type, TF32/HF32 "
            "switches) or an op implementation chosen for speed (ACL_OP_SELECT_IMPL_MODE="
            "high_precision). Set the mode that keeps the dtype (must_keep_origin_dtype) or run "
            "that op in fp32 explicitly.",
        )
    return finding(
        cid,
        "pass",
        f"{len(results)} precision-sensitive ops run at the device's own {expected} precision",
        evidence,
    )


def graph_dtypes(ctx: CheckContext, limit: int = 20) -> Finding:
    """Every op of one forward, device vs reference: which ran below the reference's dtype."""
    from precguard.checks._graphs import ops_below_reference
    from precguard.checks.amp import SENSITIVE_OPS

    bench = lab(ctx)
    cid = "ops.graph_dtypes"
    below = ops_below_reference(bench, SENSITIVE_OPS)
    sensitive = [e for e in below if e["sensitive"]]
    evidence = {"ops_below_reference": below[:limit], "count": len(below)}
    if not below:
        return finding(
            cid,
            "pass",
            f"every op of the forward on {ctx.device} ran in the reference's dtype",
            evidence,
        )
    worst = below[0]
    status = "warn" if sensitive else "pass"
    return finding(
        cid,
        status,
        f"{len(below)} op(s) ran below the reference's precision on {ctx.device}"
        + (f", {len(sensitive)} precision-sensitive" if sensitive else "")
        + f"; e.g. {worst['op']} in {worst['module']} {worst['what']} {worst['device_dtype']} "
        f"(reference {worst['reference_dtype']})",
        evidence,
        "Keep softmax, norms, reductions and exp/log in fp32: cast their inputs with .float() "
        "and the result back once; `precguard graph diff` on op-level recordings of both "
        "sides shows every such op per module."
        if sensitive
        else None,
    )


CHECKS = [
    Check(
        "ops.graph_dtypes",
        "Every op of one forward on the device vs the reference (op capture): the ops that ran "
        "below the reference's precision, per module.",
        graph_dtypes,
    ),
    Check(
        "ops.custom_modules",
        "Every custom (non-torch.nn) leaf module on its captured inputs: device vs fp64.",
        custom_modules,
    ),
    Check(
        "ops.op_precision",
        "Single precision-sensitive ops (softmax, norms, exp/log, reductions) vs fp64 on the "
        "device: which run below the device's precision.",
        op_precision,
    ),
]
