"""``op-check``: ops and modules on the device vs the fp64 oracle, over sequence lengths.

Built-in sweeps run each op of :data:`~precguard.opcheck.builtin.BUILTIN_OPS`
at every sequence length; ``module=`` runs one module of the user's model on
inputs captured from a real forward (the target's batch tiled or cut to each
length), and a rotary module on positions 0..n-1 for each n up to the model's
maximum length. Device and oracle see the same inputs, rounded to the device's
compute dtype first, so each error is the op's own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field
from torch import nn

from precguard import tree
from precguard._logging import get_logger
from precguard.capture.hooks import on_calls
from precguard.devices import resolve_backend
from precguard.errors import ExitCode, PrecguardError, TargetError, UsageError
from precguard.numerics import GROWTH_FLOOR_EPS, opcheck_tolerance
from precguard.opcheck import norm, rotary
from precguard.opcheck.builtin import BUILTIN_OPS, OpSpec, max_angle
from precguard.opcheck.measure import (
    Growth,
    fit_growth,
    op_errors,
    probe_compute_dtype,
    rope_allowed,
    round_floats,
    run_on_device,
)
from precguard.oracle import map_tensors_keeping_types, run_in_fp64
from precguard.target import Target, call_model, raised
from precguard.target_run import Side, TargetRun, model_dtype, one_side

logger = get_logger(__name__)

_FROZEN = ConfigDict(frozen=True, ser_json_inf_nan="strings")

#: sequence lengths of the built-in sweeps when none are given
DEFAULT_SEQ_LENS: tuple[int, ...] = (128, 1024, 4096)


class OpPoint(BaseModel):
    """One op (or module) at one sequence length: its errors against fp64."""

    model_config = _FROZEN

    op: str | None = Field(default=None, description="Built-in op name.")
    module: str | None = Field(default=None, description="Module of the user's model.")
    seq_len: int = Field(description="Sequence length (positions for a rotary module).")
    inputs: str | None = Field(
        default=None,
        description="Input statistics when not the captured batch's own: 'mean 8x spread' "
        "for a norm module's rows re-centred to a large mean (opcheck/norm.py).",
    )
    dtype: str = Field(description="The device's compute dtype.")
    max_abs_err: float = Field(description="max |device - fp64|.")
    mean_abs_err: float = Field(description="mean |device - fp64|.")
    max_rel_err: float = Field(description="max |device - fp64| / max |fp64|.")
    mean_rel_err: float = Field(description="mean |device - fp64| / mean |fp64|.")
    ulp_err: float = Field(description="max |device - fp64| in ULPs of the compute dtype.")
    allowed: float = Field(description="Largest max_rel_err that passes.")
    status: Literal["pass", "fail", "nonfinite"] = Field(description="Verdict of this point.")

    @property
    def label(self) -> str:
        """The op or module, with the input statistics when they are not the batch's own."""
        name = self.op or self.module or ""
        return f"{name} ({self.inputs})" if self.inputs else name


class OpCheckResult(BaseModel):
    """Every point of an op-check run and the growth of each op's error with length."""

    model_config = _FROZEN

    schema_version: int = Field(default=1, description="Format version of this file.")
    device: str = Field(description="Device under test.")
    dtype: str = Field(description="Model (activation) dtype on the device.")
    compute_dtype: str = Field(description="The lowest precision the device computes in.")
    seq_lens: list[int] = Field(description="Sequence lengths swept.")
    results: list[OpPoint] = Field(description="One entry per op (or module) and length.")
    growth: dict[str, Growth] = Field(description="Per op or module: error growth with length.")
    notes: list[str] = Field(
        default_factory=list,
        description="What the sweep left out and why (lengths past the model's positions).",
    )

    @property
    def exit_code(self) -> int:
        """1 when a point fails (or is not finite), else 0."""
        return ExitCode.FAIL if any(p.status != "pass" for p in self.results) else ExitCode.PASS


def lowest(*dtypes: torch.dtype) -> torch.dtype:
    """The least precise of ``dtypes``."""
    return max(dtypes, key=lambda d: torch.finfo(d).eps)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


class _Bench:
    """The device, its dtypes and the tolerance shared by every point of one run."""

    def __init__(self, device: str, dtype: str | torch.dtype | None, tolerance: float | None):
        self.device = device
        self.backend = resolve_backend(device)
        self.dtype = model_dtype(self.backend, dtype)
        self.compute = lowest(self.dtype, probe_compute_dtype(self.backend))
        self.eps = float(torch.finfo(self.compute).eps)
        self.tolerance = tolerance
        self.dev = self.backend.torch_device()

    def allowed(self, n: int) -> float:
        """The max_rel_err a (non-rotary) op of length ``n`` may have."""
        return (
            self.tolerance
            if self.tolerance is not None
            else opcheck_tolerance(_name(self.compute), n)
        )

    def point(
        self, got: Any, want: Any, seq_len: int, allowed: float, **name: str | None
    ) -> OpPoint:
        errors = op_errors(got, want, self.compute)
        if not math.isfinite(errors["max_abs_err"]):
            status: Literal["pass", "fail", "nonfinite"] = "nonfinite"
        else:
            status = "pass" if errors["max_rel_err"] <= allowed else "fail"
        return OpPoint(
            **name, seq_len=seq_len, dtype=_name(self.compute), allowed=allowed, status=status,
            **errors,
        )  # fmt: skip

    def result(
        self, seq_lens: Sequence[int], points: list[OpPoint], notes: Sequence[str] = ()
    ) -> OpCheckResult:
        growth: dict[str, Growth] = {}
        for key in dict.fromkeys(p.label for p in points):
            mine = [p for p in points if p.label == key]
            growth[key] = fit_growth(
                [p.seq_len for p in mine],
                [p.mean_rel_err for p in mine],
                floor=GROWTH_FLOOR_EPS * self.eps,
            )
        return OpCheckResult(
            device=self.device,
            dtype=_name(self.dtype),
            compute_dtype=_name(self.compute),
            seq_lens=list(seq_lens),
            results=points,
            growth=growth,
            notes=list(notes),
        )


def parse_seq_lens(text: str | Sequence[int] | None) -> list[int] | None:
    """``"128,1024,8192"`` -> ``[128, 1024, 8192]`` (sorted, unique); UsageError when malformed."""
    if text is None or text == "":
        return None
    items = [s.strip() for s in text.split(",")] if isinstance(text, str) else list(text)
    try:
        values = sorted({int(v) for v in items})
    except ValueError:
        raise UsageError(f"--seq-lens: expected comma-separated integers, got {text!r}") from None
    if not values or values[0] < 1:
        raise UsageError(f"--seq-lens: lengths must be at least 1, got {text!r}")
    return values


def builtin_point(bench: _Bench, spec: OpSpec, n: int, seed: int = 0) -> OpPoint:
    """One built-in op at sequence length ``n`` on the device vs fp64."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + n)
    inputs = round_floats(spec.inputs(n, gen), bench.compute)
    want = run_in_fp64(spec.fn, *inputs)
    got = run_on_device(
        spec.fn, inputs, dtype=bench.dtype, device=bench.dev, numerics=bench.backend.numerics
    )
    bench.backend.synchronize()
    allowed = rope_allowed(bench.eps, max_angle(n)) if spec.rotary else bench.allowed(n)
    return bench.point(got, want, n, allowed, op=spec.name)


def op_check(
    *,
    side: Side | None = None,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    ops: Sequence[str] | None = None,
    seq_lens: Sequence[int] | str | None = None,
    target: str | Target | None = None,
    module: str | None = None,
    tolerance: float | None = None,
    on_point: Callable[[OpPoint], None] | None = None,
) -> OpCheckResult:
    """Sweep built-in ops (or one module of ``target``) on ``device`` against fp64.

    Without ``module``: each op of ``ops`` (default: all of
    :data:`BUILTIN_OPS`) at each of ``seq_lens`` (default
    :data:`DEFAULT_SEQ_LENS`). With ``target`` and ``module``: that module,
    see :func:`module_points`. ``tolerance`` bounds ``max_rel_err``
    (default :func:`precguard.numerics.opcheck_tolerance`; rotary ones get the angle allowance).

    A module's sweep may say its side as a :class:`~precguard.Side` (the one way:
    ``op_check(side=Side("tiny-llama", "emu:bf16"), module="model.norm")``; its
    ``prepare`` alters the model the module is taken from) instead of ``target``,
    ``device`` and ``dtype``; the built-in ops need only ``device`` (required then).
    """
    prepare = None
    if side is not None:
        side = one_side(side, "op_check", device=device, dtype=dtype)
        if target is not None:
            raise UsageError("op_check: target given beside side=; set it on the Side")
        target, device, dtype, prepare = side.target, side.device, side.dtype, side.prepare
    if device is None:
        raise UsageError("op_check: no device given (pass side= or device=)")
    lens = parse_seq_lens(seq_lens)
    if tolerance is not None and not (tolerance > 0 and math.isfinite(tolerance)):
        raise UsageError(f"--tolerance must be a positive number, got {tolerance}")
    if module is not None and target is None:
        raise UsageError("--module needs --target: the model the module belongs to")
    if module is None and target is not None:
        raise UsageError("--target needs --module: which module of the model to sweep")
    if module is not None and ops:
        raise UsageError("--module and --ops cannot be used together")
    if module is None:
        names = list(ops) if ops else list(BUILTIN_OPS)
        unknown = [n for n in names if n not in BUILTIN_OPS]
        if unknown:
            from precguard.suggest import did_you_mean

            raise UsageError(
                f"unknown op {unknown[0]!r}{did_you_mean(unknown[0], BUILTIN_OPS, n=1)}; "
                f"built-in ops: {', '.join(BUILTIN_OPS)}"
            )
    bench = _Bench(device, dtype, tolerance)
    points: list[OpPoint] = []
    notes: list[str] = []

    def add(point: OpPoint) -> None:
        points.append(point)
        if on_point is not None:
            on_point(point)

    if module is None:
        lens = lens or list(DEFAULT_SEQ_LENS)
        for name in names:
            for n in lens:
                add(builtin_point(bench, BUILTIN_OPS[name], n))
    else:
        assert target is not None
        lens = module_points(bench, target, module, lens, add, notes, prepare=prepare)
    return bench.result(lens, points, notes)


# -- a module of the user's model -------------------------------------------------------------


def _capture(model: nn.Module, module: nn.Module, batch: Any, who: str) -> tuple[tuple, dict]:
    """The (args, kwargs) of ``module``'s first call in a forward of ``batch`` (CPU, fp32)."""
    seen: list[tuple[tuple, dict]] = []

    def pre(_name: str, _m: nn.Module, args: tuple, kwargs: dict) -> None:
        if not seen:
            detach = lambda t: t.detach().clone()  # noqa: E731
            seen.append(
                (map_tensors_keeping_types(args, detach), map_tensors_keeping_types(kwargs, detach))
            )

    # a capture that fails is the sweep's error: reported, it would sweep nothing
    handle = on_calls(module, pre, modules=["root"], errors="raise")
    try:
        with torch.no_grad():
            call_model(model, batch)
    except (Exception, SystemExit) as exc:  # a target's sys.exit() is its error too
        raise TargetError(f"{who}: the forward {raised(exc)}") from exc
    finally:
        handle.remove()
    if not seen:
        raise UsageError(f"{who}: the module is not called in the model's forward")
    return seen[0]


def batch_of_length(batch: Any, length: int) -> Any:
    """``batch`` with its sequence axis (dim 1 of its 2-D+ tensors) tiled or cut to ``length``.

    Every tensor whose dim 1 has the length of the first such tensor is
    changed (ids, masks, labels alike); a batch without one is returned as is.
    """
    seq = next((t.shape[1] for t in _tensor_leaves(batch) if t.dim() >= 2), None)
    if not seq or seq == length:
        return batch
    reps = -(-length // seq)

    def fit(t: torch.Tensor) -> torch.Tensor:
        if t.dim() < 2 or t.shape[1] != seq:
            return t
        return t.repeat(1, reps, *([1] * (t.dim() - 2)))[:, :length]

    return map_tensors_keeping_types(batch, fit)


_tensor_leaves = tree.tensors


#: where a model's config says how many positions it takes (HF's names, GPT-2's, nanoGPT's,
#: a hand-written decoder's ``max_positions``)
POSITION_ATTRS = (
    "max_position_embeddings",
    "n_positions",
    "max_positions",
    "max_seq_len",
    "block_size",
    "seq_length",
)


def max_length(model: nn.Module) -> int | None:
    """The model's maximum sequence length from its config, if it says."""
    config = getattr(model, "config", None)
    for attr in POSITION_ATTRS:
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def rotary_lengths(limit: int) -> list[int]:
    """128, 512, 2048, ... (x4) below ``limit``, and ``limit`` itself."""
    lens, n = [], 128
    while n < limit:
        lens.append(n)
        n *= 4
    return [*lens, limit]


def module_points(
    bench: _Bench,
    target: str | Target,
    name: str,
    seq_lens: list[int] | None,
    add: Callable[[OpPoint], None],
    notes: list[str] | None = None,
    *,
    prepare: Callable[[nn.Module], Any] | None = None,
) -> list[int]:
    """Sweep module ``name`` of ``target``'s model; returns the lengths swept.

    Lengths past the model's positions (its config's, :data:`POSITION_ATTRS`; or,
    when it does not say, the first length whose fp32 forward on the CPU raises
    beyond the batch's own length) are left out, and ``notes`` says so. A
    normalization module (:func:`~precguard.opcheck.norm.looks_like_norm`) runs at
    each length twice: on the captured rows and on them re-centred to a large mean
    (:func:`~precguard.opcheck.norm.with_large_mean`), the rows norms fail on.

    A rotary module (named *Rotary*/*RoPE*, following ``forward(x,
    position_ids) -> (cos, sin)``) is called on positions 0..n-1 for each n
    (default: x4 steps from 128 up to the model's maximum length, or 4096);
    any other module (and a rotary-named one that does not follow that
    convention) on the inputs captured from a forward of the target's
    batch tiled or cut to n tokens (default: the batch's own length and the
    built-in lengths up to the model's maximum).
    """
    run = TargetRun.on(target, bench.device, bench.backend, bench.dtype)
    run.prepare = prepare
    target_obj = run.target
    model = run.prepared(run.construct()).to("cpu", torch.float32).eval()
    try:
        mod = model.get_submodule(name)
    except AttributeError:
        from precguard.suggest import did_you_mean

        names = [n for n, _ in model.named_modules() if n]
        raise UsageError(
            f"target {target_obj.name!r} has no module {name!r}{did_you_mean(name, names, n=1)}"
        ) from None
    who = f"module {name!r} of {target_obj.name!r}"
    batch = run.batch(0)
    args, kwargs = _capture(model, mod, batch, who)
    limit = max_length(model)
    not_rotary = ""
    if rotary.looks_rotary(mod):
        try:
            return _rotary_points(bench, name, mod, args, kwargs, seq_lens, limit, add)
        except rotary.NotRotary as exc:  # named like one, called otherwise: sweep it as captured
            logger.info("rotary_convention_not_followed", module=name, reason=str(exc))
            not_rotary = str(exc)
        except PrecguardError:
            raise
        except (Exception, SystemExit) as exc:  # its own call convention: the captured inputs
            logger.info("rotary_convention_not_followed", module=name, reason=raised(exc))
            not_rotary = f"{name} on positions 0..n-1 {raised(exc)}"
    if not_rotary:
        try:
            return _captured_points(
                bench, name, mod, model, batch, args, kwargs, seq_lens, limit, add, notes, who
            )
        except TargetError as exc:
            raise TargetError(
                f"{who} looks rotary but takes neither forward(x, position_ids) -> (cos, sin) "
                f"({not_rotary}) nor its captured inputs tiled to n tokens ({exc}): op-check "
                "--module takes a module of either kind"
            ) from exc
    return _captured_points(
        bench, name, mod, model, batch, args, kwargs, seq_lens, limit, add, notes, who
    )


def _captured_points(
    bench: _Bench,
    name: str,
    mod: nn.Module,
    model: nn.Module,
    batch: Any,
    args: tuple,
    kwargs: dict,
    seq_lens: list[int] | None,
    limit: int | None,
    add: Callable[[OpPoint], None],
    notes: list[str] | None,
    who: str,
) -> list[int]:
    """``mod`` on its inputs captured from a forward of the batch tiled to each length."""
    own = next((t.shape[1] for t in _tensor_leaves(batch) if t.dim() >= 2), None)
    default = sorted({*DEFAULT_SEQ_LENS, *([own] if own else [])})
    lens = seq_lens or default
    notes = notes if notes is not None else []
    if limit:
        past = [n for n in lens if n > limit]
        lens = [n for n in lens if n <= limit]
        if past:
            notes.append(
                f"lengths past the model's {limit} positions left out: "
                f"{', '.join(map(str, past))} (its config says it takes {limit})"
            )
        if not lens:
            raise UsageError(f"--seq-lens: every length is past the {limit} positions of {who}")
    swept: list[int] = []
    for n in lens:
        try:
            a, k = (
                (args, kwargs) if n == own else _capture(model, mod, batch_of_length(batch, n), who)
            )
        except TargetError as exc:
            if limit or not own or n <= own or not swept:
                raise
            # the model does not say how many positions it takes, and its own fp32 forward
            # on the CPU refuses this length: that is its limit, not the device's error
            notes.append(
                f"stopped at {n} tokens: the model's own forward (fp32, CPU) fails there "
                f"({exc}); swept up to {swept[-1]}"
            )
            break
        floats = [t for t in _tensor_leaves((a, k)) if t.is_floating_point()]
        if not all(bool(torch.isfinite(t).all()) for t in floats):
            # nothing to compare: an upstream module overflows already in fp32 on the CPU
            raise TargetError(
                f"{who}: its inputs captured from the fp32 forward on the CPU at {n} tokens "
                "hold NaN/Inf (a module before it overflows at reference precision): op-check "
                "the module that produces them"
            )
        for inputs, (ai, ki) in _input_cases(mod, a, k).items():
            ai, ki = round_floats(ai, bench.compute), round_floats(ki, bench.compute)
            try:
                want = run_in_fp64(mod, *ai, **ki)
                got = run_on_device(
                    mod, ai, ki, dtype=bench.dtype, device=bench.dev,
                    numerics=bench.backend.numerics,
                )  # fmt: skip
            except PrecguardError:
                raise
            except (Exception, SystemExit) as exc:
                raise TargetError(f"{who} at {n} tokens {raised(exc)}") from exc
            add(bench.point(got, want, n, bench.allowed(n), module=name, inputs=inputs))
        swept.append(n)
    return swept


def _input_cases(mod: nn.Module, args: tuple, kwargs: dict) -> dict[str | None, tuple]:
    """The inputs a module runs on at one length: as captured and, for a norm, large-mean rows."""
    cases: dict[str | None, tuple] = {None: (args, kwargs)}
    if norm.looks_like_norm(mod):
        shifted = norm.with_large_mean(args, kwargs)
        if shifted is not None:
            cases[norm.large_mean_label()] = shifted
    return cases


def _rotary_points(
    bench: _Bench,
    name: str,
    mod: nn.Module,
    args: tuple,
    kwargs: dict,
    seq_lens: list[int] | None,
    limit: int | None,
    add: Callable[[OpPoint], None],
) -> list[int]:
    """Positions 0..n-1 of a rotary module for each n; :class:`NotRotary` before any point."""
    x = rotary.first_input(name, args, kwargs)
    lens = seq_lens or rotary_lengths(limit or 4096)
    inv = getattr(mod, "inv_freq", None)
    fmax = float(inv.detach().abs().max()) if isinstance(inv, torch.Tensor) else 1.0
    points = []
    for n in lens:
        positions = rotary.positions_like(args, kwargs, n)
        want = rotary.rotary_oracle(name, mod, x, positions, kwargs)
        _, got = rotary.rotary_on(
            name, mod, x, positions, kwargs, dtype=bench.dtype, device=bench.dev,
            numerics=bench.backend.numerics,
        )  # fmt: skip
        allowed = rope_allowed(bench.eps, (n - 1) * fmax)
        points.append(bench.point(got, want, n, allowed, module=name))
    for point in points:  # all or nothing: a module that fails the convention falls back whole
        add(point)
    return lens
