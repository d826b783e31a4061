"""The fp64 oracle: run a function or module with every floating-point step in fp64.

Re-running a module's own code on fp64 inputs is *not* an fp64 reference: an
explicit downcast inside it (``x.half()``, ``.to(torch.bfloat16)``, a
``dtype=torch.float16`` argument, autocast) still runs that part in low
precision, so a norm that squares in fp16 agrees with its own "fp64" run and
scores error 0. :func:`run_in_fp64` runs the code under a
``TorchDispatchMode`` that keeps all floating-point work in fp64:

* floating inputs and (with ``module=``) a deep copy of the module's floating
  parameters and buffers are fp64; the caller's tensors and module are never
  touched;
* a cast to a floating dtype (``_to_copy``: ``.half()``, ``.float()``,
  ``.to(torch.bfloat16)``, ``.type_as``, the casts autocast inserts) becomes a
  cast to fp64, a floating ``dtype=`` argument of a factory or reduction op
  (``arange``, ``zeros``, ``sum``, ``softmax``...) becomes fp64, and complex
  dtypes become ``complex128``;
* any other op that meets an fp32/fp16/bf16 tensor (a constant the code keeps
  outside its buffers, a tensor created with the default dtype) computes on
  an fp64 copy of it; the default dtype is fp64 while the oracle runs, and
  autocast is disabled.

Limits, by construction: integer and boolean work is left as it is (token
ids, masks, ``argmax``); random ops draw fp64 numbers, which are not the
numbers an fp32 run draws; an in-place or ``out=`` op that writes into a
low-precision tensor created *outside* the call still rounds into it (views
keep the dtype of what they view); work that leaves the dispatcher (a custom
C++/CUDA/Triton kernel reading ``data_ptr``, ``.numpy()``, ``.item()`` turned
into Python math) is not seen and runs as written. The oracle runs on the CPU,
and the default dtype it sets is process-wide: do not run other torch work in
another thread meanwhile.

>>> import torch
>>> def norm16(x):                       # squares in fp16: overflows for |x| > 256
...     return x * torch.rsqrt(x.half().pow(2).mean(-1, keepdim=True).float() + 1e-6)
>>> x = torch.full((1, 4), 1e3)
>>> norm16(x).abs().max().item(), round(run_in_fp64(norm16, x).abs().max().item(), 6)
(0.0, 1.0)
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from precguard import tree

__all__ = ["Fp64Mode", "map_tensors_keeping_types", "run_in_fp64", "to_fp64"]

_FLOAT = frozenset({torch.float16, torch.bfloat16, torch.float32})
_COMPLEX = frozenset({torch.complex32, torch.complex64})


def _wide(dtype: torch.dtype) -> torch.dtype:
    """The fp64 counterpart of a floating or complex dtype; any other dtype unchanged."""
    if dtype in _FLOAT:
        return torch.float64
    if dtype in _COMPLEX:
        return torch.complex128
    return dtype


def _widen(value: Any) -> Any:
    """An fp64 (complex128) copy of a low-precision tensor; anything else unchanged."""
    if isinstance(value, torch.Tensor) and (value.dtype in _FLOAT or value.dtype in _COMPLEX):
        return value.to(_wide(value.dtype))
    return value


@cache
def _facts(func: torch._ops.OpOverload) -> tuple[bool, frozenset[str], tuple[str, ...]]:
    """(passes through unchanged, names of written arguments, argument names) of an overload."""
    schema = func._schema
    written = frozenset(
        a.name for a in schema.arguments if a.alias_info is not None and a.alias_info.is_write
    )
    passthrough = func.is_view or torch.Tag.inplace_view in func.tags
    return passthrough, written, tuple(a.name for a in schema.arguments)


class Fp64Mode(TorchDispatchMode):
    """Keep every floating-point op in fp64: downcasts and low ``dtype=`` arguments become fp64.

    Prefer :func:`run_in_fp64`, which also makes the fp64 copies of inputs and
    module and disables autocast.
    """

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        passthrough, written, names = _facts(func)
        if passthrough:
            return func(*args, **kwargs)  # a view keeps the dtype of what it views
        requested = kwargs.get("dtype")
        if isinstance(requested, torch.dtype):
            kwargs["dtype"] = _wide(requested)
        if func.overloadpacket in (torch.ops.aten._softmax, torch.ops.aten._log_softmax):
            args = (*args[:2], False, *args[3:])  # half_to_float: the input is fp64 here
        if written:
            # in place / out=: the written tensor keeps its dtype, what it reads is widened
            args = tuple(
                a if i < len(names) and names[i] in written else tree_map(_widen, a)
                for i, a in enumerate(args)
            )
            kwargs = {k: v if k in written else tree_map(_widen, v) for k, v in kwargs.items()}
            return func(*args, **kwargs)
        out = func(*tree_map(_widen, args), **tree_map(_widen, kwargs))
        return tree_map(_widen, out)


#: apply a function to every tensor of a nested value, keeping the containers' types
#: (the package's one walker, :func:`precguard.tree.map_tensors`)
map_tensors_keeping_types = tree.map_tensors


def to_fp64(value: Any) -> Any:
    """A copy of a nested value with every floating tensor in fp64 on the CPU (detached).

    Containers keep their types (:func:`map_tensors_keeping_types`); integer and
    boolean tensors are copied to the CPU as they are.
    """

    def widen(t: torch.Tensor) -> torch.Tensor:
        t = t.detach().to("cpu")
        return t.to(_wide(t.dtype)) if t.dtype in _FLOAT or t.dtype in _COMPLEX else t.clone()

    return map_tensors_keeping_types(value, widen)


@contextlib.contextmanager
def _fp64_everywhere() -> Iterator[None]:
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.autocast("cpu", enabled=False))
            if torch.cuda.is_available():
                stack.enter_context(torch.autocast("cuda", enabled=False))
            stack.enter_context(Fp64Mode())
            yield
    finally:
        torch.set_default_dtype(previous)


def run_in_fp64(
    fn: Callable[..., Any] | nn.Module,
    *args: Any,
    module: nn.Module | None = None,
    copy_module: bool = True,
    **kwargs: Any,
) -> Any:
    """Run ``fn(*args, **kwargs)`` with all floating-point work in fp64, on the CPU.

    Floating tensors in ``args``/``kwargs`` (nested in tuples, lists, dicts or
    ``ModelOutput``) are replaced by fp64 copies. With ``module``, ``fn`` is
    called with a deep copy of it in fp64 as its first argument, so the user's
    module is never changed; ``fn`` may also be a module itself, which is then
    copied the same way and called. The call runs without autograd under
    :class:`Fp64Mode` (casts and ``dtype=`` arguments to fp32/fp16/bf16 become
    fp64), with autocast off and fp64 as the default dtype. See the module
    docstring for what it cannot see.

    ``copy_module=False`` hands ``fn`` the module itself: each op then widens the
    fp32 weights it reads (one transient fp64 copy per op instead of an fp64 copy
    of the whole model; the same numbers). Use it for a whole large model whose
    forward writes into no parameter or buffer (eval mode).

    >>> norm = torch.nn.RMSNorm(8)                                  # doctest: +SKIP
    >>> exact = run_in_fp64(norm, x)                                # doctest: +SKIP
    >>> exact = run_in_fp64(lambda m, h: m(h)[0], h, module=layer)  # doctest: +SKIP
    """
    if isinstance(fn, nn.Module) and module is None:
        module, fn = fn, _call_first
    wide_args = to_fp64(args)
    wide_kwargs = to_fp64(kwargs)
    with torch.no_grad():
        if module is not None and copy_module:
            # deepcopy first, then cast: the user's parameters keep their dtype and device
            wide_args = (copy.deepcopy(module).to(device="cpu", dtype=torch.float64), *wide_args)
        elif module is not None:
            wide_args = (module, *wide_args)
        with _fp64_everywhere():
            return fn(*wide_args, **wide_kwargs)


def _call_first(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)
