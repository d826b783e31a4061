"""``norm`` checks: every LayerNorm/RMSNorm-like module against fp64 on extreme inputs.

Normalisation is where low precision bites first: the variance of large
activations overflows fp16, the variance of small ones underflows to zero, a
missing eps turns a constant row into 0/0. Each norm module (found by type
and by behaviour: its output does not change when its input is scaled) runs
on the device and under the fp64 oracle (:mod:`precguard.oracle`, which also
turns the module's own downcasts into fp64) on the same hand-made rows, shaped
like the ones real LLM activations produce.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from precguard.checks._lab import NORM_TYPES, Lab, first_tensor, lab, rel_error, run_module
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding
from precguard.numerics import PRECISION_STEP
from precguard.oracle import run_in_fp64
from precguard.report.models import NORM_CASE_LABELS as CASE_LABELS

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
        y1, y3 = first_tensor(run_in_fp64(mod, x)), first_tensor(run_in_fp64(mod, 3.0 * x))
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


def extreme_inputs(dtype: torch.dtype, sample: torch.Tensor) -> dict[str, torch.Tensor]:
    """Rows shaped like ``sample`` that real activations reach, exactly representable in ``dtype``.

    Massive activations: a few fixed channels of 1e3-1e4 in every token, as Sun et
    al. (2024, "Massive Activations in Large Language Models") measured in LLaMA2,
    Mixtral and others; near-constant rows and rows whose mean dwarfs their spread
    (the cancellation of one-pass variance formulas); tiny variance (where eps
    dominates and squares underflow fp16); one outlier per row (the outlier
    features of LLM.int8(), Dettmers et al. 2022). None comes near the dtype's
    maximum: a correct norm computed in fp32 stays exact on all of them.
    """
    gen = torch.Generator().manual_seed(1234)
    shape = sample.shape
    dim = shape[-1]
    base = torch.randn(shape, generator=gen, dtype=torch.float64)
    rows = base[..., :1].numel()
    steps = torch.arange(rows, dtype=torch.float64).reshape(*shape[:-1], 1)
    scale = 1.0 + steps.remainder(7)  # 1..7: rows of different magnitude
    sign = torch.where(steps.remainder(2) == 0, 1.0, -1.0).to(torch.float64)
    massive = base.clone()
    massive[..., 0] = 2e3
    massive[..., dim // 2] = -1e4
    outlier = base.clone()
    where = torch.randint(0, dim, (*shape[:-1], 1), generator=gen)
    outlier.scatter_(-1, where, 100.0 * sign.expand(*shape[:-1], 1))
    cases = {
        "typical": base,
        "constant_rows": sign * scale * torch.ones(shape, dtype=torch.float64),
        "near_constant": sign * scale * (1 + 1e-3 * base),
        "mean_offset": 50.0 * scale + 0.05 * scale * base,
        "tiny_variance": base * 1e-4,
        "massive_activations": massive,
        "outlier_per_row": outlier,
    }
    return {k: v.to(dtype).to(torch.float64) for k, v in cases.items()}


def row_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """The worst relative L2 error of a row (last dim) of ``actual`` against ``expected``.

    Rows whose expected value is all zero count their absolute error. Per row,
    so one broken row is not averaged away by the others.
    """
    a = actual.detach().to("cpu", torch.float64)
    e = expected.detach().to("cpu", torch.float64)
    if not torch.isfinite(a).all():
        return math.inf
    diff = (a - e).flatten(0, -2).norm(dim=-1) if a.dim() > 1 else (a - e).norm()[None]
    ref = e.flatten(0, -2).norm(dim=-1) if e.dim() > 1 else e.norm()[None]
    return float(torch.where(ref > 0, diff / ref.clamp_min(1e-300), diff).max())


def conditioning(x: torch.Tensor, eps: float | None, centred: bool) -> float:
    """How much a correct norm amplifies rounding on ``x``: rms / sqrt(var + eps) when it centres.

    Subtracting the mean of a row whose mean dwarfs its spread cancels leading
    digits in any precision; the tolerance grows by this factor (1 for RMSNorm).
    """
    if not centred:
        return 1.0
    var = x.var(-1, unbiased=False)
    rms = x.pow(2).mean(-1).sqrt()
    return float((rms / (var + (eps or 0.0)).sqrt().clamp_min(1e-300)).clamp_min(1.0).max())


def output_bound(mod: nn.Module, sample: torch.Tensor) -> float | None:
    """The largest row RMS any normalization by ``mod`` can output: ``max|gain| + max|bias|``.

    A normalized row ``h = (x - m) / sqrt(mean((x - m)^2) + eps)`` (or ``x / rms(x)``)
    has RMS at most 1 for *any* ``m``: a correct norm, however it rounds the mean,
    stays there. Only statistics computed apart from the centring (a one-pass
    variance ``E[x^2] - E[x]^2`` that cancels) can leave it. The gain and bias are
    measured, not read (``1 + w`` gains included): on the rows ``s = R (+1, -1, ...)``
    (mean 0, RMS ``R``) and ``-s`` the fp64 oracle outputs ``±g*s/R + b``. None when the
    rows are odd (no such ``s``) or the module does not run alone.
    """
    dim = sample.shape[-1]
    if dim % 2:
        return None
    # rows of RMS 2^26, not 1: eps (added to the variance) then moves the output by
    # eps / 2^53, below fp64's rounding, so the gain is read exactly
    s = torch.full((dim,), 2.0**26, dtype=torch.float64)
    s[1::2] = -(2.0**26)
    rows = torch.stack([s, -s]).reshape(*([1] * (sample.dim() - 2)), 2, dim)
    try:
        y = first_tensor(run_in_fp64(mod, rows))
    except Exception:
        return None
    if y is None or y.shape != rows.shape:
        return None
    y = y.reshape(2, dim)
    gain, bias = (y[0] - y[1]) / 2, (y[0] + y[1]) / 2
    return float(gain.abs().max() + bias.abs().max())


def worst_row_rms(x: torch.Tensor) -> float:
    """The largest RMS of a row (last dim) of ``x``."""
    x = x.detach().to("cpu", torch.float64)
    return float(x.pow(2).mean(-1).sqrt().max())


def _centres(mod: nn.Module, x: torch.Tensor) -> bool:
    """True when adding a constant to every row leaves the output unchanged (LayerNorm)."""
    try:
        y0 = first_tensor(run_in_fp64(mod, x))
        y1 = first_tensor(run_in_fp64(mod, x + 3.0))
    except Exception:
        return False
    return y0 is not None and y1 is not None and row_error(y1, y0) < 1e-6


def extreme_inputs_check(ctx: CheckContext, tolerance: float | None = None) -> Finding:
    """Run each norm module on extreme inputs on the device and under the fp64 oracle; compare.

    The tolerance is ``4·eps`` of the compute dtype, times the row's conditioning
    for norms that centre (LayerNorm on rows whose mean dwarfs their spread: a
    correct norm rounds the mean, that much of the spread). Whatever the
    conditioning, an output row beyond the RMS any normalization gives
    (:func:`output_bound`, ``4·eps`` of rounding allowed) fails: its statistics are off.
    """
    bench = lab(ctx)
    cid = "norm.extreme_inputs"
    modules = norm_modules(bench)
    if not modules:
        raise NotApplicable("no LayerNorm/RMSNorm-like module found (by type or behaviour)")
    tol = tolerance if tolerance is not None else 4 * bench.eps
    # (severity, message): the worst is named first; severity is error / allowance
    failures: list[tuple[float, str]] = []
    warnings: list[tuple[float, str]] = []
    margins: list[tuple[float, float, float, str]] = []  # (err / allowed, err, allowed, where)
    per_module: dict[str, Any] = {}
    for name, (mod, sample, how) in modules.items():
        eps = _eps_of(mod)
        cases = extreme_inputs(bench.compute_dtype, sample)
        centred = _centres(mod, cases["typical"])
        result: dict[str, Any] = {
            "type": type(mod).__name__,
            "found_by": how,
            "eps": eps,
            "centres": centred,
        }
        smallest = float(
            torch.finfo(bench.compute_dtype).tiny * torch.finfo(bench.compute_dtype).eps
        )
        if eps is not None and eps <= 0:
            failures.append((math.inf, f"{name}: eps = {eps}"))
        elif eps is not None and eps < smallest / 2:
            # below the smallest subnormal: eps itself rounds to 0 in the compute dtype
            failures.append((math.inf, f"{name}: eps = {eps:g} rounds to 0 in {bench.cname}"))
        bound = output_bound(mod, sample)
        if bound is not None:
            result["output_rms_bound"] = bound
        for case, x in cases.items():
            try:
                ref = first_tensor(run_in_fp64(mod, x))
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
                failures.append((math.inf, f"{name}: NaN/Inf on {label}"))
                continue
            if bound is not None:
                rms = worst_row_rms(got)
                if rms > bound * (1 + tol):
                    # beyond any normalization's output (output_bound): the statistics are
                    # off, however ill-conditioned the row (the conditioning below excuses
                    # a rounded mean, never this)
                    result[f"{case}_output_rms"] = rms
                    failures.append(
                        (
                            rms / bound,
                            f"{name}: output rows reach RMS {rms:.3g} on {label}, beyond the "
                            f"{bound:.3g} any normalization gives (max |gain| + |bias|): its "
                            "mean/variance are off (one-pass E[x^2]-E[x]^2 cancelling?)",
                        )
                    )
            err = row_error(got, ref)
            allowed = tol * conditioning(x, eps, centred)
            result[case] = err
            margins.append((err / allowed, err, allowed, f"{name} on {label}"))
            if err > PRECISION_STEP * allowed:
                failures.append((err / allowed, f"{name}: error {err:.2g} vs fp64 on {label}"))
            elif err > allowed:
                warnings.append((err / allowed, f"{name}: error {err:.2g} vs fp64 on {label}"))
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
    # a norm that centres (LayerNorm) needs its mean subtracted before the variance: the
    # one-pass E[x^2] - E[x]^2 cancels on rows whose mean dwarfs their spread, in any dtype
    remedy_centred = (
        "Compute the statistics in fp32, the mean first and the variance of the centred "
        "rows (two passes), and cast once at the end: `x32 = x.float(); mu = "
        "x32.mean(-1, keepdim=True); var = (x32 - mu).pow(2).mean(-1, keepdim=True); y = "
        "(x32 - mu) * torch.rsqrt(var + eps); return (y * weight + bias).to(x.dtype)` (or "
        "F.layer_norm on the fp32 input); never E[x^2] - E[x]^2."
    )
    if failures:
        failures.sort(key=lambda f: -f[0])
        messages = [m for _, m in failures]
        worst = per_module.get(messages[0].split(":")[0], {})
        if worst.get("centres"):
            remedy = remedy_centred
        return finding(
            cid,
            "fail",
            f"{len(set(m.split(':')[0] for m in messages))} norm module(s) break on extreme "
            f"inputs: {messages[0]}",
            {**evidence, "failures": messages[:20]},
            remedy,
        )
    if warnings:
        warnings.sort(key=lambda w: -w[0])
        return finding(
            cid,
            "warn",
            f"norm error above tolerance on extreme inputs: {warnings[0][1]}",
            {**evidence, "warnings": [m for _, m in warnings][:20]},
            remedy,
        )
    not_rerun = sorted(n for n, r in per_module.items() if "not_rerun" in r)
    if not margins:
        raise NotApplicable(
            f"none of the {len(modules)} norm module(s) could be re-run alone "
            f"({not_rerun[0]}: {per_module[not_rerun[0]]['not_rerun']})"
            if not_rerun
            else "no norm module produced a comparable output"
        )
    _ratio, err, allowed, where = max(margins, default=(0.0, 0.0, tol, "nothing"))
    return finding(
        cid,
        "pass",
        f"{len(modules)} norm module(s) stay finite and within tolerance of fp64 on extreme "
        f"inputs (worst: error {err:.2g} for {where}, allowed {allowed:.2g})"
        + (f"; {len(not_rerun)} could not be re-run alone (see evidence)" if not_rerun else ""),
        evidence,
    )


CHECKS = [
    Check(
        "norm.extreme_inputs",
        "Each norm module vs fp64 on constant, large, tiny and near-limit rows; eps present.",
        extreme_inputs_check,
    ),
]
