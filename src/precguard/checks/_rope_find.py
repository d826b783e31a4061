"""Finding rotary embeddings by what they compute, not by what they are called.

A hand-written decoder often has no ``*Rotary*`` module: a plain function
computes ``cos``/``sin`` of ``position × inv_freq`` inside the attention. Such
calls are recognised in a real forward: a ``cos`` or ``sin`` whose argument,
computed under the fp64 oracle, is affine along one axis (the positions) and
not constant along it. The same calls in a device and a reference forward of
the same batch are matched by module and order, and their per-position error
against the oracle is what the ``rope`` checks judge.

A module that applies RoPE from a table built at init has no cos/sin in its
forward: :func:`rotation_modules` finds it by what it does to its input (every
channel pair keeps its length and turns by an angle that grows with the
position) and judges how far those angles are from a straight line in the
position, which no oracle re-run could improve.
"""

from __future__ import annotations

import math
import os
import sys
from collections import Counter
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from precguard._logging import get_logger
from precguard.checks._lab import Lab, flatten, run_module
from precguard.checks._trace import SHARED_WATCHES, OpCallback, SharedWatch, watch_ops
from precguard.numerics import rope_sweep_positions
from precguard.opcheck.sweep import batch_of_length
from precguard.oracle import run_in_fp64
from precguard.target import call_model

logger = get_logger(__name__)

_TRIG = {"cos", "sin"}
_SKIP_DIRS = (
    os.path.dirname(torch.__file__),
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))),  # precguard itself
)


@dataclass(frozen=True)
class TrigFound:
    """The cos/sin calls of one module found by behaviour, and their errors per position."""

    where: str  # "rope_cos_sin (decoder.py:42)"
    calls: int
    positions: torch.Tensor  # 0..n-1 (the batch's own positions)
    device_error: torch.Tensor  # max abs error vs the oracle, per position
    reference_error: torch.Tensor
    max_angle: torch.Tensor  # largest |angle| per position (fp64)


def _caller() -> str:
    """The innermost frame of the user's code (outside torch and precguard): 'fn (file:line)'."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if not path.startswith(_SKIP_DIRS) and not path.startswith("<"):
            return f"{frame.f_code.co_name} ({os.path.basename(path)}:{frame.f_lineno})"
        frame = frame.f_back
    return "?"


def _position_axis(angles: torch.Tensor) -> int | None:
    """The axis along which ``angles`` (fp64) grow linearly and are not constant, if any."""
    scale = float(angles.abs().max()) if angles.numel() else 0.0
    if not scale:
        return None
    for axis in reversed(range(angles.dim())):
        if angles.shape[axis] < 3:
            continue
        step = angles.diff(dim=axis)
        if float(step.abs().max()) > 1e-9 * scale and float(
            step.diff(dim=axis).abs().max()
        ) <= 1e-9 * max(scale, 1.0):
            return axis
    return None


def _trig_seen(found: list[dict[str, Any]], keep_args: bool = True) -> OpCallback:
    """An op callback appending each cos/sin call (module, op, fp64 value, angles) to ``found``."""

    def record(op: str, args: tuple, _kwargs: dict, result: Any, module: str) -> None:
        x = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if x is None or not x.is_floating_point() or not isinstance(result, torch.Tensor):
            return
        found.append(
            {
                "module": module,
                "op": op,
                "value": result.detach().to("cpu", torch.float64),
                "angles": x.detach().to("cpu", torch.float64) if keep_args else None,
                "where": _caller() if keep_args else "",
            }
        )

    return record


#: the oracle's forward of batch 0 that the lab runs once (Lab.watched) records cos/sin
SHARED_WATCHES["rope_trig"] = SharedWatch(frozenset(_TRIG), _trig_seen, frozenset({"oracle"}))


def _by_occurrence(found: list[dict[str, Any]]) -> dict[tuple, dict]:
    """cos/sin calls keyed by (module, op, occurrence of that op in that module)."""
    calls: dict[tuple, dict] = {}
    seen: Counter[tuple[str, str]] = Counter()
    for call in found:
        module, op = call["module"], call["op"]
        calls[(module, op, seen[(module, op)])] = call
        seen[(module, op)] += 1
    return calls


def _watched_forward(model: nn.Module, batch: Any, keep_args: bool) -> dict[tuple, dict]:
    """cos/sin calls of one forward by (module, op, occurrence); values fp64 on the CPU."""
    found: list[dict[str, Any]] = []
    with watch_ops(model, _TRIG, _trig_seen(found, keep_args)):
        call_model(model, batch)
    return _by_occurrence(found)


def longer_batch(batch: Any, length: int) -> Any:
    """``batch`` with its sequence axis tiled up to ``length`` (never cut).

    op-check's :func:`~precguard.opcheck.sweep.batch_of_length` when the batch
    is shorter; a batch already as long is returned as is.
    """
    seq = next(
        (t.shape[1] for _, t in flatten(batch) if isinstance(t, torch.Tensor) and t.dim() >= 2),
        None,
    )
    if not seq or seq >= length:
        return batch
    return batch_of_length(batch, length)


def rope_by_behaviour(bench: Lab, exclude: list[str], length: int) -> dict[str, TrigFound]:
    """Modules whose forward computes cos/sin of position × frequency (not under ``exclude``).

    One forward of batch 0 under the fp64 oracle finds the calls; when some lie
    outside ``exclude``, the batch's sequence is tiled to ``length`` positions
    (the target's own length when the model refuses it) and the calls are
    judged on forwards under the oracle, on the device and on the reference.
    """
    key = f"rope_by_behaviour:{length}:{exclude}"
    if key not in bench._cache:
        bench._cache[key] = _find(bench, exclude, length)
    return bench._cache[key]


def _excluded(module: str, exclude: list[str]) -> bool:
    return any(module == e or module.startswith(f"{e}.") for e in exclude)


def _oracle_calls(bench: Lab, batch: Any) -> dict[tuple, dict]:
    # the shared CPU fp32 reference, not an fp64 copy of it: each op widens what it reads
    return run_in_fp64(
        lambda m, b: _watched_forward(m, b, keep_args=True),
        batch,
        module=bench.reference_model(),
        copy_module=False,
    )


def _rope_calls(exact: dict[tuple, dict], exclude: list[str]) -> dict[tuple, int]:
    """The calls of ``exact`` that are cos/sin of position × frequency, with their position axis."""
    rope = {}
    for k, call in exact.items():
        if _excluded(k[0], exclude):
            continue
        axis = _position_axis(call["angles"])
        if axis is not None:
            rope[k] = axis
    return rope


def _find(bench: Lab, exclude: list[str], length: int) -> dict[str, TrigFound]:
    batch = bench.batch(0)
    try:
        # batch 0 under the oracle: the forward the lab runs once for every oracle watch
        exact = _by_occurrence(bench.watched("rope_trig", "oracle") or [])
    except Exception as exc:  # a model the oracle cannot run: say so, keep the name-found ones
        bench._cache["rope_by_behaviour_failed"] = f"{type(exc).__name__}: {exc}"
        logger.warning("rope_oracle_forward_failed", error=f"{type(exc).__name__}: {exc}")
        return {}
    rope = _rope_calls(exact, exclude)
    if not rope:
        return {}
    # the shortest sweep that decides (numerics.rope_sweep_positions), at most `length`
    fastest = max(float(exact[k]["angles"].diff(dim=axis).abs().max()) for k, axis in rope.items())
    longer = longer_batch(batch, min(length, rope_sweep_positions(fastest)))
    if longer is batch:  # long enough already: judged on the shared oracle run's calls
        return _judge_calls(bench, batch, exclude, exact)
    try:
        return _judge_calls(bench, longer, exclude)
    except Exception as exc:  # a model that cannot take more positions: its own length
        logger.info("rope_longer_batch_refused", error=f"{type(exc).__name__}: {exc}")
        return _judge_calls(bench, batch, exclude, exact)


def _judge_calls(
    bench: Lab, batch: Any, exclude: list[str], exact: dict[tuple, dict] | None = None
) -> dict[str, TrigFound]:
    """Per-position errors of the cos/sin calls on ``batch`` (``exact``: its oracle calls)."""
    if exact is None:
        exact = _oracle_calls(bench, batch)
    rope = _rope_calls(exact, exclude)
    runs = {}
    for on in ("device", "reference"):
        model = bench.copy(on)
        placed = bench.place(batch, on)
        with torch.no_grad(), bench.numerics(on):
            runs[on] = _watched_forward(model, placed, keep_args=False)
        del model
    found: dict[str, dict[str, Any]] = {}
    for k, axis in rope.items():
        want = exact[k]["value"]
        n = want.shape[axis]
        errors = {}
        for on, calls in runs.items():
            got = calls.get(k)
            if got is None or got["value"].shape != want.shape:
                break
            err = torch.nan_to_num((got["value"] - want).abs(), nan=float("inf"))
            errors[on] = err.movedim(axis, -1).reshape(-1, n).amax(dim=0)
        else:
            entry = found.setdefault(
                k[0],
                {
                    "where": exact[k]["where"],
                    "calls": 0,
                    "n": n,
                    "device": torch.zeros(n, dtype=torch.float64),
                    "reference": torch.zeros(n, dtype=torch.float64),
                    "angle": torch.zeros(n, dtype=torch.float64),
                },
            )
            if entry["n"] != n:
                continue
            angle = exact[k]["angles"].abs().movedim(axis, -1).reshape(-1, n).amax(dim=0)
            entry["calls"] += 1
            entry["device"] = torch.maximum(entry["device"], errors["device"])
            entry["reference"] = torch.maximum(entry["reference"], errors["reference"])
            entry["angle"] = torch.maximum(entry["angle"], angle)
    return {
        module: TrigFound(
            where=e["where"],
            calls=e["calls"],
            positions=torch.arange(e["n"]),
            device_error=e["device"],
            reference_error=e["reference"],
            max_angle=e["angle"],
        )
        for module, e in found.items()
    }


# -- modules that rotate pairs of channels -------------------------------------------------

#: how channel pairs are laid out: (i, i + D/2) as HF's rotate_half, or (2i, 2i + 1)
_LAYOUTS = ("half", "interleaved")


def _pairs(x: torch.Tensor, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    if layout == "half":
        return x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2 :]
    return x[..., 0::2], x[..., 1::2]


def _rotation_angles(x: torch.Tensor, y: torch.Tensor, layout: str) -> torch.Tensor | None:
    """Angles (positions × pairs) by which ``y`` rotates the channel pairs of ``x``, or None.

    None unless every pair keeps its length (within 1%, so a table rounded to bf16
    still counts) and some pair turns. ``x``/``y`` are (..., D) in fp64 with a
    position axis among the others; the angle of each (position, pair) is read
    from the element with the longest pair over the remaining axes, and unwrapped
    along the positions.
    """
    if x.shape != y.shape or x.dim() < 2 or x.shape[-1] % 2:
        return None
    xa, xb = _pairs(x, layout)
    ya, yb = _pairs(y, layout)
    rx, ry = torch.hypot(xa, xb), torch.hypot(ya, yb)
    if not float(rx.max()) or float((ry - rx).abs().max()) > 1e-2 * float(rx.max()):
        return None
    theta = torch.atan2(xa * yb - xb * ya, xa * ya + xb * yb)
    # the position axis is the one along which the angles change most ((B, H, T, D) or
    # (B, T, H, D) alike); the others (batch, heads) repeat the same angles
    axes = [a for a in range(theta.dim() - 1) if theta.shape[a] >= 3]
    if not axes:
        return None
    axis = max(axes, key=lambda a: float(theta.diff(dim=a).abs().mean()))
    theta, rx = theta.movedim(axis, -2), rx.movedim(axis, -2)
    t, half = theta.shape[-2], theta.shape[-1]
    theta, rx = theta.reshape(-1, t, half), rx.reshape(-1, t, half)
    theta = theta.gather(0, rx.argmax(dim=0, keepdim=True))[0]  # (T, pairs)
    if float(theta.abs().max()) < 1e-6:
        return None  # nothing turns (a scaling, an identity)
    step = torch.remainder(theta.diff(dim=0) + torch.pi, 2 * torch.pi) - torch.pi
    return torch.cat((theta[:1], theta[:1] + step.cumsum(dim=0)), dim=0)


def _affine_residual(theta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per position: the largest distance of the angles from their least-squares line, |angle|."""
    p = torch.arange(theta.shape[0], dtype=torch.float64)[:, None]
    pc = p - p.mean()
    slope = (pc * (theta - theta.mean(0))).sum(0) / (pc * pc).sum()
    fit = theta.mean(0) + pc * slope
    return (theta - fit).abs().amax(dim=1), fit.abs().amax(dim=1)


@dataclass(frozen=True)
class RotationFound:
    """A module that rotates channel pairs by angles affine in position, and how well it does."""

    layout: str
    positions: torch.Tensor
    device_error: torch.Tensor  # per position: distance of the device's angles from a line
    reference_error: torch.Tensor
    max_angle: torch.Tensor


def rotation_modules(bench: Lab, exclude: list[str]) -> dict[str, RotationFound]:
    """Captured modules that rotate pairs of channels (RoPE applied from a table), by behaviour.

    A module's captured call is run under the fp64 oracle: an output that keeps
    the length of every channel pair of the input of its shape, turned by angles
    that grow along the positions, is a rotary embedding. Its angles must lie on
    a line in position (position × frequency); the distance from the best line is
    the error judged, on the device and on the reference. It catches tables
    computed in low precision once at init, which an oracle re-run cannot see.
    """
    key = f"rotation_modules:{exclude}"
    if key in bench._cache:
        return bench._cache[key]
    found: dict[str, RotationFound] = {}
    for name, (mod, args, kwargs) in bench.module_inputs().items():
        if name == "root" or _excluded(name, exclude):
            continue
        inputs = [t for _, t in flatten((args, kwargs)) if isinstance(t, torch.Tensor)]
        inputs = [t for t in inputs if t.is_floating_point() and t.dim() >= 2]
        if not inputs:
            continue
        try:
            exact = [t for _, t in flatten(run_in_fp64(mod, *args, **kwargs))]
        except Exception:
            continue
        hit = _first_rotation(inputs, exact)
        if hit is None:
            continue
        index, source, layout, theta = hit
        if float(_affine_residual(theta)[0].max()) > 0.5:
            continue  # not affine in position at all: some other rotation
        errors = {}
        try:
            for on in ("device", "reference"):
                backend = bench.device if on == "device" else bench.reference
                out = run_module(
                    mod,
                    args,
                    kwargs,
                    dtype=bench.dtype if on == "device" else torch.float32,
                    device=backend.torch_device(),
                    numerics=backend.numerics,
                )
                y = [t for _, t in flatten(out)][index].detach().to("cpu", torch.float64)
                angles = _rotation_angles(source.double(), y, layout)
                errors[on] = (
                    _affine_residual(angles)[0]
                    if angles is not None
                    else torch.full((theta.shape[0],), math.inf, dtype=torch.float64)
                )
        except Exception as exc:  # the device cannot run it alone: judge no further
            logger.info("rotation_module_not_rerun", module=name, error=str(exc))
            continue
        found[name] = RotationFound(
            layout=layout,
            positions=torch.arange(theta.shape[0]),
            device_error=errors["device"],
            reference_error=errors["reference"],
            max_angle=_affine_residual(theta)[1],
        )
    bench._cache[key] = found
    return found


def _first_rotation(
    inputs: list[torch.Tensor], outputs: list[Any]
) -> tuple[int, torch.Tensor, str, torch.Tensor] | None:
    """(output index, its input, pair layout, angles) of the first output rotating an input."""
    for index, y in enumerate(outputs):
        if not isinstance(y, torch.Tensor) or not y.is_floating_point():
            continue
        for x in inputs:
            if x.shape != y.shape:
                continue
            for layout in _LAYOUTS:
                theta = _rotation_angles(x.double(), y.double(), layout)
                if theta is not None:
                    return index, x, layout, theta
    return None
