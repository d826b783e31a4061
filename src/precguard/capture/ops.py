"""Op-level capture: every torch op a model calls, recorded under the module that called it.

Module hooks see modules; a port goes wrong *inside* them (an op autocast ran
in bfloat16, a vendor kernel that replaced a dozen small ops, an op that fell
back to the CPU). ``monitor(model, level="op")`` (or ``"both"``) records each
op as a pseudo-module below its enclosing module::

    model.layers.0.self_attn.op.softmax.0.forward.output.0
    └ enclosing module ──────┘ └ op ──┘ └ call of that op in that module, this step

so compare sees op records as children of the module that ran them, and the
first divergence can name the op.

Two levels, chosen with ``ops_at``:

* ``"function"`` (default): a :class:`~torch.overrides.TorchFunctionMode`. It
  sees what the model's code calls, by the names the code uses: ``torch.*``,
  ``F.*``, Tensor methods and operators (``a + b`` is ``add``), custom ops
  (``torch.library``), also when imported as ``from torch import relu`` — no
  namespace is patched. It sits above autograd, so an op's inputs and outputs
  are the tensors the model holds; nested calls inside one function (what
  ``F.softmax`` runs) are not seen separately. This is the level for "which
  op in my code", and the one graph diff compares between backends.
* ``"aten"``: a :class:`~torch.utils._python_dispatch.TorchDispatchMode`. It
  sees the aten ops actually dispatched after decompositions and autocast's
  casts (``aten._softmax``, ``aten.mm``, ``aten._to_copy``): the level for
  "what did the dispatcher run". It composes with the ``emu:`` emulator's own
  dispatch mode: it is entered inside it, so it records the ops the model
  asked for and the values the emulated chip returned.

Both are forward only (backward runs in autograd's engine, below both) and
are entered only while the monitored root module runs, so code outside the
model is never intercepted. precguard's own tensor work (statistics, host
copies) runs under :func:`precguard.capture.stats.in_capture` and passes
through unrecorded; calls that return no tensor (``x.shape``, ``x.dim()``) are
never recorded. Layout and metadata ops (views, ``reshape``, indexing,
``contiguous``, constant factories) are exact and skipped unless an ``ops``
glob names them; ``nn.Parameter`` arguments are not recorded as op inputs
(the module records hold the parameters). The results the model gets are the
very tensors the op returned: instrumented output stays bitwise equal.
"""

from __future__ import annotations

import fnmatch
import functools
import itertools
import weakref
from typing import Any

import torch
from torch import nn

from precguard._logging import get_logger
from precguard.capture.flatten import named_tensors
from precguard.capture.hooks import HookHandle, OpsHandle, on_calls, on_ops
from precguard.capture.monitor import module_names
from precguard.capture.options import CaptureOptions
from precguard.capture.recording import CallFrame, Recording
from precguard.capture.stats import in_capture
from precguard.errors import NonFiniteError

logger = get_logger(__name__)

#: ops that only move, view or describe elements, or make constants: exact on every
#: backend, skipped unless an ``ops`` glob names them
LAYOUT_OPS = frozenset(
    {"view", "view_as", "reshape", "reshape_as", "transpose", "transpose_", "permute", "t",
     "contiguous", "expand", "expand_as", "unsqueeze", "squeeze", "flatten", "unflatten",
     "getitem", "__getitem__", "setitem", "__setitem__", "split", "chunk", "narrow", "select",
     "unbind", "movedim", "detach", "detach_", "clone", "alias", "slice", "as_strided",
     "_unsafe_view", "lift_fresh", "requires_grad_", "ones", "zeros", "empty", "full",
     "ones_like", "zeros_like", "empty_like", "full_like", "new_ones", "new_zeros",
     "new_empty", "new_full", "tensor", "as_tensor", "scalar_tensor", "empty_strided",
     "__get__", "_has_compatible_shallow_copy_type", "copy_", "__set__"}
)  # fmt: skip

#: Python operator names torch reports for Tensor dunders, by the op they run
_DUNDER = {"truediv": "div", "floordiv": "floor_divide", "rtruediv": "div", "rsub": "rsub"}


@functools.cache
def function_op_name(func: Any) -> tuple[str, str]:
    """``(op, qualified)`` names of a function seen by a TorchFunctionMode.

    ``op`` goes into keys (``softmax``, ``add``, ``rope`` for a custom
    ``mylib::rope``); ``qualified`` is what the record's ``module_type`` says
    (``torch.nn.functional.softmax``, ``Tensor.add``, ``mylib::rope``).

    >>> function_op_name(torch.softmax)
    ('softmax', 'torch.softmax')
    """
    if isinstance(func, torch._ops.OpOverload):
        packet = func.overloadpacket
        return packet.__name__, str(packet._qualified_op_name)
    name = getattr(func, "__name__", None) or type(func).__name__
    qual = getattr(func, "__qualname__", name)
    if name.startswith("__") and name.endswith("__") and name != "__get__":
        bare = name[2:-2]
        if bare in _DUNDER:
            name = _DUNDER[bare]
        elif bare.startswith("i") and len(bare) > 2:
            name = bare[1:] + "_"  # __iadd__ -> add_
        elif bare.startswith("r") and bare not in ("repr",) and len(bare) > 2:
            name = bare[1:]  # __radd__ -> add
        else:
            name = bare
    module = getattr(func, "__module__", None)
    if qual.startswith(("TensorBase.", "_TensorBase.")) or module == "torch._tensor":
        qualified = "Tensor." + name
    elif module in ("torch", "torch._C._nn", "torch._C._VariableFunctions") or qual.startswith(
        "_VariableFunctionsClass."
    ):
        qualified = "torch." + name
    elif module:
        qualified = f"{module}.{name}"
    else:
        qualified = qual
    return name, qualified


@functools.cache
def aten_op_name(func: Any) -> tuple[str, str]:
    """``(op, qualified)`` names of an aten overload (``('_softmax', 'aten._softmax')``)."""
    packet = func.overloadpacket
    ns = func.namespace
    return packet.__name__, f"{ns}.{packet.__name__}" if ns == "aten" else str(packet)


def _is_layout_aten(func: Any, name: str) -> bool:
    return name in LAYOUT_OPS or bool(getattr(func, "is_view", False))


class OpCapture:
    """Records the ops run inside ``root``'s modules into ``sink`` (see the module doc).

    ``own_steps``: no module-level :class:`~precguard.capture.monitor.Monitor`
    runs beside it (``level="op"``), so it counts the root's calls (steps) and
    flushes at the end of each root forward itself.
    """

    def __init__(
        self,
        root: nn.Module,
        sink: Recording,
        options: CaptureOptions,
        *,
        root_name: str = "root",
        own_steps: bool = False,
    ) -> None:
        self.sink = sink
        self.options = options
        self.own_steps = own_steps
        #: enclosing module names, innermost last, while the root runs
        self.stack: list[str] = []
        self.removed = False
        self._depth = 0
        #: the op watch of the root forward running now (None between forwards)
        self._ops: OpsHandle | None = None
        self._aten = options.ops_at == "aten"
        #: (module, op) -> (the key call counts use, the op's record module, its tensors saved)
        self._sites: dict[tuple[str, str], tuple[object, str, bool]] = {}
        self._selected: dict[str, bool] = {}  # module name -> its ops are recorded
        self._wanted: dict[tuple[str, bool], bool] = {}  # (op, layout) -> recorded
        self._failed: set[str] = set()
        first = next(itertools.chain(root.parameters(), root.buffers()), None)
        self._device = first.device.type if first is not None else "cpu"
        names = module_names(root, root_name)
        #: module -> qualified name, weak (as the Monitor's) so no handle keeps a model alive
        self.names: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary(names)
        # the stack stays balanced when a module raises (always_call); the hooks catch
        # their own errors (the mode's entry and exit), so no wrapper of the layer's
        self._hooks = HookHandle()
        self._hooks._add(
            on_calls(
                root,
                self._push,
                self._pop,
                modules=lambda _n, m: m is not root,
                with_kwargs=False,
                root_name=root_name,
                errors="raise",
                always_call=True,
            )
        )
        self._hooks._add(
            on_calls(
                root,
                self._root_pre,
                self._root_post,
                modules=[root_name],
                with_kwargs=False,
                root_name=root_name,
                errors="raise",
                always_call=True,
            )
        )

    # -- module stack ----------------------------------------------------------------------

    def _push(self, name: str, module: nn.Module, args: Any) -> None:
        if self.stack:
            self.stack.append(name)

    def _pop(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if len(self.stack) > 1:
            self.stack.pop()

    def _root_pre(self, name: str, module: nn.Module, args: Any) -> None:
        if self.removed or self.sink.closed:
            return
        self._depth += 1
        if self._depth > 1:  # the root called from inside itself: one forward
            self.stack.append(name)
            return
        try:
            if self.own_steps:
                self.sink.begin_call(module, root=True)
            self.stack = [name]
            ops = on_ops(run=self._intercept, level=self.options.ops_at)
            ops.__enter__()
            self._ops = ops
        except Exception as exc:
            self.stack = []
            self._report("enter", exc)

    def _root_post(self, name: str, module: nn.Module, args: Any, output: Any) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth > 0:
            if len(self.stack) > 1:
                self.stack.pop()
            return
        self.stack = []
        ops, self._ops = self._ops, None
        try:
            if ops is not None:
                ops.remove()
            if self.own_steps and not self.sink.closed:
                self.sink.flush()
        except Exception as exc:
            self._report("exit", exc)

    # -- ops -------------------------------------------------------------------------------

    def _intercept(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """Every op run while the root runs: precguard's own pass, the model's are recorded."""
        if in_capture() or not self.stack:
            return func(*args, **kwargs)
        if self._aten:
            name, qualified = aten_op_name(func)
            layout = _is_layout_aten(func, name)
        else:
            name, qualified = function_op_name(func)
            layout = name in LAYOUT_OPS
        return self.run(func, name, qualified, layout, args, kwargs)

    def _records(self, module: str, name: str, layout: bool) -> bool:
        """Whether op ``name`` run directly in ``module`` is recorded under the filters."""
        selected = self._selected.get(module)
        if selected is None:
            globs = self.options.op_modules
            selected = globs is None or any(CaptureOptions.saves_pattern(module, g) for g in globs)
            self._selected[module] = selected
        if not selected:
            return False
        wanted = self._wanted.get((name, layout))
        if wanted is None:
            globs = self.options.ops
            if globs is None:
                wanted = not layout
            else:
                wanted = any(fnmatch.fnmatchcase(name, g) for g in globs)
            self._wanted[(name, layout)] = wanted
        return wanted

    def run(
        self,
        func: Any,
        name: str,
        qualified: str,
        layout: bool,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        """Run ``func`` as the model asked and record it; its result is returned untouched."""
        module = self.stack[-1]
        if self.removed or not self._records(module, name, layout):
            return func(*args, **kwargs)
        sink = self.sink
        # An op is known to be one (a tensor result) only once it ran, and x.numel() or
        # a hook's t.register_hook() are no ops: inputs are recorded after the call,
        # except for an in-place or out= op, whose inputs it overwrites.
        inplace = name.endswith("_") or "out" in kwargs
        frame = self._enter(module, name, qualified, args, kwargs) if inplace else None
        result = func(*args, **kwargs)
        try:
            outputs = named_tensors(result, "output")
            if not outputs:
                return result
            if frame is None:
                frame = self._enter(module, name, qualified, args, kwargs)
            if frame is None:
                return result
            device = outputs[0][1].device.type
            # an op that fell back to (or was sent to) another device says which
            sink.leave(frame, outputs, extra={"device": device} if device != self._device else None)
        except NonFiniteError:
            raise
        except Exception as exc:
            self._report(name, exc)
        return result

    def _enter(
        self,
        module: str,
        name: str,
        qualified: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> CallFrame | None:
        """Count one call of op ``name`` in ``module`` and record its inputs (None: not)."""
        sink = self.sink
        if sink.closed:
            return None
        try:
            site = self._sites.get((module, name))
            if site is None:  # once per (module, op): not the name and glob work per call
                op_module = f"{module}.op.{name}"
                site = self._sites[(module, name)] = (
                    object(),
                    op_module,
                    self.options.saves(op_module),
                )
            key, op_module, save = site
            items = [
                (n, t)
                for n, t in named_tensors(args, "args") + named_tensors(kwargs, "kwargs")
                if not isinstance(t, nn.Parameter)
            ]
            return sink.enter(
                key,
                op_module,
                qualified,
                items,
                root=False,
                save=save,
                on_nonfinite=self.options.on_nonfinite,
            )
        except Exception as exc:
            self._report(name, exc)
            return None

    def _report(self, where: str, exc: BaseException) -> None:
        if where in self._failed:
            return
        self._failed.add(where)
        logger.error("op_hook_failed", op=where, error=f"{type(exc).__name__}: {exc}")

    # -- lifecycle -------------------------------------------------------------------------

    def remove(self) -> None:
        """Remove every hook (and leave a mode still entered). Idempotent."""
        if self.removed:
            return
        self.removed = True
        self._hooks.remove()
        ops, self._ops = self._ops, None
        if ops is not None:
            try:
                ops.remove()
            except Exception as exc:  # not the innermost mode any more: torch refuses
                self._report("remove", exc)
        self.stack = []


class CaptureHooks:
    """The module-level :class:`Monitor` and/or the :class:`OpCapture` of one ``monitor()``.

    ``names`` and ``remove()`` are what :class:`~precguard.capture.api.MonitorHandle`
    uses of a monitor.
    """

    def __init__(self, *parts: Any) -> None:
        self.parts = [p for p in parts if p is not None]
        self.names = self.parts[0].names

    @property
    def removed(self) -> bool:
        """True once every part was removed."""
        return all(p.removed for p in self.parts)

    def remove(self) -> None:
        """Remove every part's hooks. Idempotent."""
        errors: list[BaseException] = []
        for p in self.parts:
            try:
                p.remove()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]
