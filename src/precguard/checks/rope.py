"""``rope`` checks: rotary embeddings swept over positions against fp64.

Rotary angles are ``position * inv_freq``: computed in bf16 (8 significant
bits) the angle at position 300 is off by about one radian, so cos/sin are
garbage exactly where long inputs need them. The error of a correct
implementation stays flat over positions; a low-precision one grows with the
position. That is what these checks look for.

Rotary modules found by class name (``*Rotary*``, ``*RoPE*``) must follow
the HF convention ``forward(x, position_ids) -> (cos, sin)`` and are swept
over positions; declare others that follow it with the checklist parameter
``modules: [glob, ...]``. Any other cos/sin of position × frequency (a plain
function in a hand-written attention) is found by behaviour
(:mod:`precguard.checks._rope_find`) and judged on batch 0, tiled when
shorter to the fewest positions that decide
(:func:`precguard.numerics.rope_sweep_positions`). The truth is always the
fp64 oracle (:mod:`precguard.oracle`).

The rotary sweep itself (calling a module on any positions, on the device and
under the oracle, the error per position, the angle allowance) is op-check's
(:mod:`precguard.opcheck.rotary`); these checks judge its curves.
"""

from __future__ import annotations

import fnmatch
from typing import Any

import torch
from torch import nn

from precguard.checks._lab import Lab, lab
from precguard.checks._rope_find import rope_by_behaviour, rotation_modules
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding
from precguard.numerics import rope_allowed, rope_floor
from precguard.opcheck import rotary

_BINS = 8


def rotary_modules(
    bench: Lab, patterns: list[str] | None = None
) -> dict[str, tuple[nn.Module, tuple, dict]]:
    """Rotary modules with their captured call: by class name, or by ``patterns`` (globs)."""
    found = {}
    for name, (mod, args, kwargs) in bench.module_inputs().items():
        declared = patterns and any(fnmatch.fnmatchcase(name, p) for p in patterns)
        if declared or (not patterns and rotary.looks_rotary(mod)):
            found[name] = (mod, args, kwargs)
    return found


def _errors(
    bench: Lab, name: str, mod: nn.Module, args: tuple, kwargs: dict, positions: torch.Tensor
) -> dict[str, Any]:
    """Max abs error of cos/sin per position on device and reference (and inv_freq's dtype).

    op-check's rotary sweep (:mod:`precguard.opcheck.rotary`) does the work: the
    fp64 oracle (which also turns the module's own .float()/autocast/dtype= casts
    into fp64) and the device and reference runs of a copy of the module.
    """
    try:
        x = rotary.first_input(name, args, kwargs)
        want = rotary.rotary_oracle(name, mod, x, positions, kwargs)
        runs = {
            "device": (bench.dtype, bench.dev, bench.device.numerics),
            "reference": (torch.float32, bench.reference.torch_device(), bench.reference.numerics),
        }
        errors: dict[str, Any] = {}
        for label, (dtype, dev, numerics) in runs.items():
            m, got = rotary.rotary_on(
                name, mod, x, positions, kwargs, dtype=dtype, device=dev, numerics=numerics
            )
            inv = getattr(m, "inv_freq", None)
            if label == "device" and isinstance(inv, torch.Tensor):
                errors["inv_freq_dtype"] = inv.dtype
            errors[label] = rotary.per_position_error(got, want, positions.shape[-1])
    except rotary.NotRotary as exc:
        raise NotApplicable(str(exc)) from exc
    return errors


def _judge(
    bench: Lab,
    name: str,
    device_err: torch.Tensor,
    reference_err: torch.Tensor,
    positions: torch.Tensor,
    max_angle: torch.Tensor,
    hint: str = "",
) -> tuple[dict[str, Any], str | None]:
    """Bin per-position errors vs fp64; a failure message when the device's error grows or is large.

    Allowed (``numerics.rope_allowed``): ``4·eps`` of the compute dtype, or what angles
    rounded to fp32 cost at that position (``4·2**-24·(1 + |angle|)``), whichever is
    larger. The
    reference is judged by the same rule: when it fails too, the code computes
    the angles in low precision everywhere, not only on the device.
    """
    dev_bins = [float(b.max()) for b in device_err.tensor_split(_BINS)]
    ref_bins = [float(b.max()) for b in reference_err.tensor_split(_BINS)]
    angle_bins = [float(b.max()) for b in max_angle.tensor_split(_BINS)]
    edges = [int(b[0]) for b in positions.tensor_split(_BINS)]
    first, last = dev_bins[0], dev_bins[-1]
    growth = last / max(first, bench.eps / 2)
    allowed = [rope_allowed(bench.eps, a) for a in angle_bins]
    entry: dict[str, Any] = {
        "bin_start_positions": edges,
        "device_max_abs_error": dev_bins,
        "reference_max_abs_error": ref_bins,
        "allowed": allowed,
        "growth_first_to_last_bin": growth,
    }
    if ref_bins[-1] > allowed[-1]:
        hint += "; the reference computes it the same way (the code, not the device)"
    second = edges[1] - 1 if len(edges) > 1 else edges[0]
    if last > allowed[-1] and growth > 4:
        return entry, (
            f"{name}: cos/sin error grows with position from {first:.2g} (positions "
            f"{edges[0]}-{second}) to {last:.2g} (from position {edges[-1]}){hint}"
        )
    if last > allowed[-1] and first > allowed[0]:
        return entry, (
            f"{name}: cos/sin error {first:.2g} already at positions {edges[0]}-{second}, "
            f"{last:.2g} from position {edges[-1]} (allowed {allowed[-1]:.2g}){hint}"
        )
    return entry, None


def sweep(
    ctx: CheckContext,
    max_position: int | None = None,
    points: int = 512,
    modules: list[str] | None = None,
    check_id: str = "rope.position_sweep",
) -> Finding:
    """Sweep positions 0..max_position on device and reference; fail when error grows.

    Rotary modules found by name are swept over positions; cos/sin computed by
    plain functions (found by behaviour) are judged on forwards of batch 0, tiled
    when shorter to the fewest positions that decide
    (:func:`precguard.numerics.rope_sweep_positions`), at most
    ``min(points, max_position)``.
    """
    bench = lab(ctx)
    found = rotary_modules(bench, modules)
    limit = max_position or bench.max_positions() or 4096
    count = min(points, limit)
    positions = torch.linspace(0, limit - 1, count).round().long().unique()[None, :]
    tol = rope_floor(bench.eps)
    per_module: dict[str, Any] = {}
    failures: list[str] = []
    for name, (mod, args, kwargs) in found.items():
        try:
            errs = _errors(bench, name, mod, args, kwargs, positions)
        except Exception:
            if modules:
                raise  # declared by the user: not following the convention is worth an error
            continue  # named *Rotary* but not HF-like: left to the search by behaviour
        inv_dtype = errs.get("inv_freq_dtype")
        hint = ""
        if inv_dtype is not None and inv_dtype not in (torch.float32, torch.float64):
            inv_name = str(inv_dtype).removeprefix("torch.")
            hint = f"; its inv_freq buffer is {inv_name} after the dtype cast"
        inv = getattr(mod, "inv_freq", None)
        fmax = float(inv.detach().abs().max()) if isinstance(inv, torch.Tensor) else 1.0
        entry, failure = _judge(
            bench, name, errs["device"], errs["reference"], positions[0], positions[0] * fmax, hint
        )
        per_module[name] = {"type": type(mod).__name__, "found_by": "name", **entry}
        if hint:
            per_module[name]["inv_freq_dtype"] = inv_dtype
        if failure:
            failures.append(failure)
    swept = list(per_module)
    behaviour = {} if modules else rope_by_behaviour(bench, swept, min(points, limit))
    rotations = {} if modules else rotation_modules(bench, swept + list(behaviour))
    if not per_module and not behaviour and not rotations:
        failed = bench._cache.get("rope_by_behaviour_failed")
        searched = (
            f"the fp64 forward that looks for cos/sin failed ({failed})"
            if failed
            else "no cos/sin of position x frequency in a forward and no module rotating "
            "channel pairs"
        )
        raise NotApplicable(
            f"no rotary embedding found: no HF-like module named *Rotary*/*RoPE* and "
            f"{searched}; declare a module that follows forward(x, position_ids) -> (cos, sin) "
            "with the checklist parameter `modules: [name glob]`"
        )
    for name, trig in behaviour.items():
        entry, failure = _judge(
            bench, name, trig.device_error, trig.reference_error, trig.positions, trig.max_angle
        )
        per_module[name] = {
            "found_by": "behaviour: cos/sin of position x frequency",
            "computed_in": trig.where,
            "trig_calls": trig.calls,
            **entry,
        }
        if failure:
            failures.append(f"{failure} (computed by {trig.where})")
    for name, rot in rotations.items():
        entry, failure = _judge(
            bench, name, rot.device_error, rot.reference_error, rot.positions, rot.max_angle
        )
        per_module[name] = {
            "type": type(bench.module_inputs()[name][0]).__name__,
            "found_by": f"behaviour: rotates channel pairs ({rot.layout} layout)",
            "error_is": "distance of the rotation angles from position x frequency",
            **entry,
        }
        if failure:
            failures.append(failure.replace("cos/sin error", "rotation angle error"))
    evidence = {
        "compute_dtype": bench.compute_dtype,
        "max_position": limit,
        "positions_tested": positions.shape[-1],
        "tolerance": tol,
        "modules": per_module,
    }
    if failures:
        return finding(
            check_id,
            "fail",
            failures[0],
            {**evidence, "failures": failures},
            "Compute the rotary angles in fp32 (or fp64 for very long contexts) and cast only "
            "cos/sin to the activation dtype: `freqs = position_ids[..., None].float() * "
            "inv_freq.float()` with autocast disabled around it "
            "(`with torch.autocast(device_type, enabled=False):`), then "
            "`emb.cos().to(x.dtype)`; keep inv_freq an fp32 buffer that model.half()/bf16 casts "
            "do not touch (re-create it after casting).",
        )
    worst = max((v["device_max_abs_error"][-1] for v in per_module.values()), default=0.0)
    reach = [limit - 1] * len(swept) + [
        int(t.positions[-1]) for t in [*behaviour.values(), *rotations.values()]
    ]
    return finding(
        check_id,
        "pass",
        f"cos/sin of {len(per_module)} rotary embedding(s) stay within {max(tol, worst):.2g} of "
        f"fp64 up to position {max(reach)} without growing with position",
        evidence,
    )


def position_sweep(
    ctx: CheckContext,
    max_position: int | None = None,
    points: int = 512,
    modules: list[str] | None = None,
) -> Finding:
    """Sweep the rotary modules up to the model's maximum length (its config)."""
    return sweep(ctx, max_position, points, modules, "rope.position_sweep")


def long_context(
    ctx: CheckContext,
    max_position: int = 32768,
    points: int = 512,
    modules: list[str] | None = None,
) -> Finding:
    """Sweep the rotary modules far beyond short prompts (default 32k positions)."""
    return sweep(ctx, max_position, points, modules, "rope.long_context")


CHECKS = [
    Check(
        "rope.position_sweep",
        "Rotary cos/sin vs fp64 over positions up to the model's max length; fails if error grows.",
        position_sweep,
    ),
    Check(
        "rope.long_context",
        "Rotary cos/sin vs fp64 up to 32k positions (long-context inference).",
        long_context,
    ),
]
