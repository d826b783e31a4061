"""The op interceptor: a TorchDispatchMode that runs every aten op with a profile's numerics.

It sits below autograd, so forward, backward and optimizer ops are all
emulated. For each op with float tensors it:

1. passes it through unchanged when precguard itself is computing
   statistics (:func:`precguard.backend.in_capture`), for views and
   metadata ops, for uninitialised allocations, for float64 work (fp64
   references stay exact) and, with ``keep_float32``, for ops on float32
   tensors only (the fp32 islands of a mixed-precision model), and for a
   matmul-like op given operands of different float dtypes (fp16 @ fp32
   outside autocast), so that torch raises the error a real device raises;
2. rounds float inputs to the op's storage dtype (as float32 values);
3. runs the op in float32 (matmul and sum/mean through the emulator's own
   accumulation and order when the profile asks for it);
4. rounds float results the same way and casts them to the dtype the op
   would have returned. In-place and ``out=`` ops are rounded in place.

Random ops draw from the emulated device's generator when the profile has a
``rng_stream``.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import TreeSpec, tree_flatten, tree_map, tree_unflatten

from precguard.backend import GEMM_PRECISION, in_capture
from precguard.backends.emu import fp8, numerics
from precguard.backends.emu.numerics import OpNumerics
from precguard.backends.emu.profile import EmuProfile

aten = torch.ops.aten

_LOW = frozenset({torch.float16, torch.bfloat16})
_EMULATED = frozenset({torch.float32, torch.float16, torch.bfloat16})
_UNINITIALISED = frozenset(
    {"empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "resize_"}
)
_MATMUL = frozenset({"mm", "bmm", "addmm", "baddbmm"})
# Ops that only move or select elements: rounding is elementwise, so rounding their
# result equals rounding their inputs, and is much cheaper for a gather from a large
# table (embedding) or a copy.
_MOVE_ONLY = frozenset(
    {"embedding", "index_select", "gather", "index", "cat", "stack", "clone", "_to_copy",
     "constant_pad_nd", "repeat", "flip", "roll", "where", "masked_fill", "_unsafe_view",
     "slice_scatter", "select_scatter", "expand_copy", "permute_copy", "narrow_copy"}
)  # fmt: skip
_SUM = frozenset({"sum", "mean"})
# Ops whose floating operands must share one dtype: torch (and every accelerator) raises
# "expected mat1 and mat2 to have the same dtype" for fp16 @ fp32 outside autocast,
# while elementwise ops promote. The emulator computes everything in fp32 and would
# hide the error; it lets the real op raise it instead.
_SAME_DTYPE = frozenset(
    {"mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "dot", "vdot", "addr",
     "_addmm_activation", "linear", "convolution", "_convolution",
     "_scaled_dot_product_flash_attention_for_cpu"}
)  # fmt: skip
_REDUCTIONS = _MATMUL | _SUM
#: the GEMMs an fp8 profile runs with fp8 operands: every Linear (forward and backward)
#: lowers to these; batched matmuls (attention's scores and values) stay at the storage dtype
_FP8_GEMMS = frozenset({"mm", "addmm"})
_SOFTMAX = frozenset({"_softmax", "_log_softmax"})


@dataclass(frozen=True)
class _OpFacts:
    """What the dispatcher needs to know about one op overload, read once from its schema."""

    name: str  # aten name without overload: "mm", "add_"
    passthrough: bool  # views, metadata and uninitialised allocations: never emulated
    seeded: bool  # draws random numbers
    takes_generator: bool
    mutable: bool  # in-place or out=
    written: frozenset[str]  # names of the arguments it writes to
    arg_names: tuple[str, ...]  # every argument's schema name, in order


@cache
def _op_facts(func: torch._ops.OpOverload) -> _OpFacts:
    # Every aten op passes through __torch_dispatch__; reading the schema and tags once
    # per overload instead of once per call keeps the per-op Python work small.
    name = func.overloadpacket.__name__
    schema = func._schema
    return _OpFacts(
        name=name,
        passthrough=func.is_view or torch.Tag.inplace_view in func.tags or name in _UNINITIALISED,
        seeded=torch.Tag.nondeterministic_seeded in func.tags,
        takes_generator=any(a.name == "generator" for a in schema.arguments),
        mutable=schema.is_mutable,
        written=frozenset(
            a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write
        ),
        arg_names=tuple(a.name for a in schema.arguments),
    )


def _map_tensors(fn: Any, out: Any) -> Any:
    """``tree_map(fn, out)``, without pytree for the common single-tensor result."""
    return fn(out) if isinstance(out, torch.Tensor) else tree_map(fn, out)


def rules_for(profile: EmuProfile) -> tuple[OpNumerics, dict[str, OpNumerics]]:
    """Return the default rules of ``profile`` and the per-op overrides, by aten op name."""

    def make(dtype_name: str) -> OpNumerics:
        return OpNumerics(
            storage=numerics.DTYPES[dtype_name],
            saturate=profile.overflow == "saturate",
            nan_to_zero=profile.nan_to_zero,
            flush_to_zero=profile.flush_to_zero,
            accumulate=numerics.DTYPES[profile.accumulate_dtype],
            block=profile.accumulate_block,
            shuffle_seed=profile.shuffle_seed if profile.shuffle_reductions else None,
            fixed_order=profile.batch_invariant or profile.split_k_rows > 0,
            split_k_rows=profile.split_k_rows,
            fp8=recipe,
        )

    recipe = None
    if profile.fp8_format != "none":
        recipe = fp8.Fp8Recipe(
            format=profile.fp8_format,
            scaling=profile.fp8_scaling,
            history=profile.fp8_amax_history,
            block=profile.fp8_block,
            scale_rounding=profile.fp8_scale_rounding,
        )

    default = make(profile.compute_dtype)
    return default, {op: make(dt) for op, dt in profile.aten_dtypes().items()}


class EmuMode(TorchDispatchMode):
    """Run aten ops with the numerics of ``profile``; ``generator`` serves random ops.

    >>> with EmuMode(profile):                    # doctest: +SKIP
    ...     y = model(x)        # every op rounded as the profile says
    """

    def __init__(self, profile: EmuProfile, generator: torch.Generator | None = None) -> None:
        super().__init__()
        self.profile = profile
        self.generator = generator
        self.default_rules, self.op_rules = rules_for(profile)
        recipe = self.default_rules.fp8
        #: delayed scaling's amax history, by GEMM site, for as long as this mode lives
        self.amax_history = fp8.AmaxHistory(recipe.history) if recipe is not None else None
        self._gemm_before: str | None = None

    def __enter__(self) -> EmuMode:
        # tell capture that Linear layers compute in fp8 (records carry it: compare judges
        # them by the fp8 GEMM's expected error)
        recipe = self.default_rules.fp8
        self._gemm_before = GEMM_PRECISION.dtype
        if recipe is not None:
            GEMM_PRECISION.dtype = recipe.dtype_name
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        GEMM_PRECISION.dtype = self._gemm_before
        super().__exit__(*exc)

    @property
    def changes_anything(self) -> bool:
        """False when entering the mode would change no op: nothing rounded, no own RNG stream."""
        return (
            self.generator is not None
            or self.default_rules.changes_values
            or any(r.changes_values for r in self.op_rules.values())
        )

    # -- dispatch ------------------------------------------------------------------------

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if in_capture():
            return func(*args, **kwargs)
        op = _op_facts(func)
        if op.passthrough:
            return func(*args, **kwargs)
        if self.generator is not None and op.seeded:
            if func is aten.native_dropout.default:
                return self._dropout(*args, **kwargs)
            if op.takes_generator and kwargs.get("generator") is None:
                kwargs["generator"] = self.generator
        rules = self.op_rules.get(op.name, self.default_rules)
        if not rules.changes_values:
            return func(*args, **kwargs)
        flat, spec = tree_flatten((args, kwargs))
        dtypes = {t.dtype for t in flat if isinstance(t, torch.Tensor)}
        if torch.float64 in dtypes:
            return func(*args, **kwargs)
        if op.name in _SAME_DTYPE and len({d for d in dtypes if d.is_floating_point}) > 1:
            return func(*args, **kwargs)  # mixed operands: the real op raises, as on a device
        if self.profile.keep_float32 and dtypes.isdisjoint(_LOW):
            return func(*args, **kwargs)  # an fp32 island of a mixed-precision model
        if op.mutable:
            return self._mutating(func, op, args, kwargs, rules)
        if rules.fp8 is not None and op.name in _FP8_GEMMS:
            return self._fp8_gemm(op, args, kwargs, rules, rules.fp8)
        return self._computing(func, op, flat, spec, dtypes, rules)

    def _fp8_gemm(
        self,
        op: _OpFacts,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        rules: OpNumerics,
        recipe: fp8.Fp8Recipe,
    ) -> torch.Tensor:
        """``mm``/``addmm`` with both operands scaled and rounded to fp8, summed in fp32."""
        bound = _bind(op.arg_names, args, kwargs)
        if op.name == "mm":
            a, b, bias = bound["self"], bound["mat2"], None
        else:
            a, b, bias = bound["mat1"], bound["mat2"], bound["self"]
        out_dtype = a.dtype
        site = fp8.site_of(b)  # the weight's own storage, before the float32 copy below

        def stored(x: torch.Tensor) -> torch.Tensor:
            return numerics.to_storage(x.float(), rules)

        a32, b32 = stored(a), stored(b)
        sa, sb = fp8.operand_scales(a32, b32, recipe, self.amax_history, site=site)
        if fp8.LOG.entries is not None:  # an fp8 check asked: read while the operands are here
            fp8.LOG.entries.append(
                {
                    "site": site,
                    "operands": [
                        fp8.operand_statistics(a32, sa, recipe.dtype),
                        fp8.operand_statistics(b32, sb, recipe.dtype),
                    ],
                }
            )
        qa, qb = fp8.quantize(a32, sa, recipe.dtype), fp8.quantize(b32, sb, recipe.dtype)
        out = numerics.matmul(qa, qb, rules)
        if bias is not None:
            alpha, beta = bound.get("alpha", 1), bound.get("beta", 1)
            out = out * alpha if alpha != 1 else out
            if beta != 0:
                out = out + (stored(bias) if beta == 1 else stored(bias) * beta)
        return numerics.to_storage(out, rules).to(out_dtype)

    # -- out-of-place ops ----------------------------------------------------------------

    def _computing(
        self,
        func: torch._ops.OpOverload,
        op: _OpFacts,
        flat: list[Any],
        spec: TreeSpec,
        dtypes: set[torch.dtype],
        rules: OpNumerics,
    ) -> Any:
        """Run ``func`` on its flattened ``(args, kwargs)``; ``dtypes`` are its tensors' dtypes."""
        name = op.name
        seen = dtypes & _EMULATED
        round_inputs = name not in _MOVE_ONLY
        # batch-invariant kernels: an elementwise op's result must not depend on where its
        # element sits (CPU kernels compute a vector's tail with scalar code, whose exp or
        # sigmoid may differ in the last bit), so it is computed in float64 and rounded
        wide = rules.fixed_order and round_inputs and name not in _REDUCTIONS | _SOFTMAX

        def prepare(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype in _EMULATED:
                y = numerics.to_storage(x.float(), rules) if round_inputs else x.float()
                return y.double() if wide else y
            return x

        args, kwargs = tree_unflatten([prepare(x) for x in flat], spec)
        # the dtype the op would have returned, when it is not float32
        target: torch.dtype | None = None
        requested = kwargs.get("dtype")
        if isinstance(requested, torch.dtype) and requested.is_floating_point:
            if requested in _LOW:
                kwargs["dtype"] = torch.float32
                target = requested
        elif name in ("_softmax", "_log_softmax") and len(args) > 2 and args[2]:
            args = (*args[:2], False)  # half_to_float: the input is float32 already
        elif torch.float32 not in seen and len(seen) == 1:
            target = next(iter(seen))  # fp16 in, fp16 out
        if rules.changes_reductions and name in _REDUCTIONS:
            out = self._reduction(func, op, args, kwargs, rules)
        elif rules.fixed_order and name in _SOFTMAX:
            out = numerics.fixed_order_softmax(args[0], args[1], log=name == "_log_softmax")
        else:
            out = func(*args, **kwargs)

        def finish(y: Any) -> Any:
            if wide and isinstance(y, torch.Tensor) and y.dtype == torch.float64:
                y = y.float()
            if isinstance(y, torch.Tensor) and y.dtype in _EMULATED:
                y = numerics.to_storage(y.float(), rules)
                return y.to(target) if target is not None else y
            return y

        return _map_tensors(finish, out)

    def _reduction(
        self,
        func: torch._ops.OpOverload,
        op: _OpFacts,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        rules: OpNumerics,
    ) -> torch.Tensor:
        name = op.name
        bound = _bind(op.arg_names, args, kwargs)
        if name in ("mm", "bmm"):
            return numerics.matmul(bound["self"], bound["mat2"], rules)
        if name in ("addmm", "baddbmm"):
            if name == "addmm":
                a, b = bound["mat1"], bound["mat2"]
            else:
                a, b = bound["batch1"], bound["batch2"]
            return numerics.addmm(
                bound["self"], a, b, rules, beta=bound.get("beta", 1), alpha=bound.get("alpha", 1)
            )
        x = bound["self"]
        if not x.is_floating_point():
            return func(*args, **kwargs)
        dims = bound.get("dim")
        return numerics.reduce_sum(
            x,
            list(dims) if dims else None,
            bool(bound.get("keepdim", False)),
            rules,
            mean=name == "mean",
        )

    # -- in-place and out= ops -----------------------------------------------------------

    def _mutating(
        self,
        func: torch._ops.OpOverload,
        op: _OpFacts,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        rules: OpNumerics,
    ) -> Any:
        written, arg_names = op.written, op.arg_names
        work: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}  # id(work copy) -> (orig, work)

        def writable(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype in _LOW:
                w = x.float()
                work[id(w)] = (x, w)
                return w
            if isinstance(x, torch.Tensor) and x.dtype == torch.float32:
                work[id(x)] = (x, x)
            return x

        def readable(x: Any) -> Any:
            if isinstance(x, torch.Tensor) and x.dtype in _EMULATED:
                return numerics.to_storage(x.float(), rules)
            return x

        new_args = []
        for i, value in enumerate(args):
            arg_name = arg_names[i] if i < len(arg_names) else ""
            new_args.append(tree_map(writable if arg_name in written else readable, value))
        new_kwargs = {
            k: tree_map(writable if k in written else readable, v) for k, v in kwargs.items()
        }
        out = func(*new_args, **new_kwargs)
        for orig, w in work.values():
            orig.copy_(numerics.to_storage(w.float(), rules))

        def finish(y: Any) -> Any:
            if not isinstance(y, torch.Tensor):
                return y
            hit = work.get(id(y))
            if hit is not None:
                return hit[0]
            if y.dtype in _EMULATED:
                return numerics.to_storage(y.float(), rules).to(y.dtype)
            return y

        return _map_tensors(finish, out)

    # -- random ops ----------------------------------------------------------------------

    def _dropout(
        self, x: torch.Tensor, p: float, train: bool | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not train or p == 0:
            return x.clone(), torch.ones_like(x, dtype=torch.bool)
        keep = torch.empty_like(x, dtype=torch.float32).bernoulli_(1 - p, generator=self.generator)
        scale = 0.0 if p >= 1 else 1.0 / (1 - p)
        return (x * keep * scale).to(x.dtype), keep.bool()


def _bind(arg_names: tuple[str, ...], args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict:
    """Map an op's arguments to their schema names (positional and keyword)."""
    bound: dict[str, Any] = {}
    for i, name in enumerate(arg_names):
        if i < len(args):
            bound[name] = args[i]
        elif name in kwargs:
            bound[name] = kwargs[name]
    return bound
