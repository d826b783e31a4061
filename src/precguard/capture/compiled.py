"""torch.compile and precguard's hooks: hooks kept out of dynamo, compiled models refused.

Module hooks run inside a compiled model's ``forward``: dynamo inlines
submodule calls, hooks included. Traced, precguard's statistics code (a C++
kernel, ``id()`` caches, dict bookkeeping) breaks the graph deep inside
precguard and recompiles ``Recording.enter`` until dynamo's recompile limit.
So every forward hook is wrapped by :func:`outside_dynamo`: dynamo never
traces it, the call is a graph break at the module boundary (in
``torch/nn/modules/module.py``), and the hook runs eagerly on the real
tensors of that boundary.

``torch.compiler.disable`` does the same, but its first use imports
``torch._dynamo`` (1.5-4.5 s here), a price every ``monitor()`` would pay
whether the user compiles or not. :func:`outside_dynamo` does its two parts
on the function itself, with no wrapper: the ``_torchdynamo_disable`` mark
dynamo reads when it meets the call while tracing (graph break, call left to
run eagerly), and the function's code marked as one dynamo's frame callback
skips together with every frame it calls, so that a hook called eagerly from
inside a compiled region (the root's hooks of a ``torch.compile``'d model,
which torch runs outside the graph) is not compiled as a frame of its own, nor
anything it calls. ``tests/capture/test_compile.py`` holds dynamo to both.

A model compiled *before* ``monitor()`` cannot be recorded: its compiled
code was traced without the hooks and dynamo does not recompile when hooks
are added later, so only the outermost call would be recorded.
:func:`compiled_modules` finds such modules; ``monitor()`` refuses them.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from torch import nn

from precguard.errors import UsageError

try:  # the C half of dynamo: present in every torch build that has torch.compile
    from torch._C._dynamo.eval_frame import _FrameAction, _FrameExecStrategy
    from torch._C._dynamo.eval_frame import set_code_exec_strategy as _set_code_exec_strategy
except ImportError:  # pragma: no cover - a torch without dynamo: nothing to keep out
    _set_code_exec_strategy = None

F = TypeVar("F", bound=Callable[..., Any])

_REASON = (
    "precguard's capture hook: it runs eagerly at the module boundary, outside compiled graphs"
)


def outside_dynamo(fn: F) -> F:
    """``fn`` itself (a function or a bound method), marked so that dynamo never traces it
    (a graph break where it is called) nor anything it calls; another callable (a
    ``functools.partial``, an object with ``__call__``) is marked through a function
    around it.

    Costs nothing per call in eager mode: no wrapper frame, no call into torch.
    """
    if _set_code_exec_strategy is None:
        return fn
    target = getattr(fn, "__func__", fn)  # a bound method: its function
    if not hasattr(target, "__code__"):
        inner = fn

        def call(*args: Any, **kwargs: Any) -> Any:
            return inner(*args, **kwargs)

        fn = target = call  # type: ignore[assignment]
    # what torch.compiler.disable sets: dynamo graph-breaks at a call of a function
    # carrying it and leaves the call to run eagerly
    target._torchdynamo_disable = True
    target._torchdynamo_disable_msg = _REASON
    target._torchdynamo_disable_recursive = True
    _skip_frames(target.__code__)
    return fn


@functools.cache
def _skip_frames(code: Any) -> None:
    """Tell dynamo's frame callback never to compile a frame of ``code``, nor any frame
    it calls.

    What ``torch._dynamo.eval_frame.skip_code`` does, recursively: dynamo's eval-frame
    function runs such a frame with its callback off (and back on after), which is what
    keeps a hook called eagerly while a compiled model runs (the root's) from being handed
    to dynamo as a frame to compile, with everything it calls. Once per code object.
    """
    _set_code_exec_strategy(code, _FrameExecStrategy(_FrameAction.SKIP, _FrameAction.SKIP))


def compiled_modules(model: nn.Module) -> list[str]:
    """Names of the modules under ``model`` that ``torch.compile`` already wrapped or compiled.

    ``torch.compile(m)`` returns an ``OptimizedModule`` (holding ``m`` as
    ``_orig_mod``); ``m.compile()`` compiles in place (``_compiled_call_impl``).
    The root is named ``root``.
    """
    found = []
    for name, mod in model.named_modules():
        wrapped = type(mod).__name__ == "OptimizedModule" and hasattr(mod, "_orig_mod")
        if wrapped or getattr(mod, "_compiled_call_impl", None) is not None:
            found.append(name or "root")
    return found


def refusal(compiled: list[str], entry: str = "monitor") -> str:
    """The one line that says why a model compiled before ``monitor()`` (or ``entry()``,
    e.g. ``watch``) is refused, and how."""
    where = "the model" if compiled[0] == "root" else "module " + compiled[0]
    more = f" (and {len(compiled) - 1} more)" if len(compiled) > 1 else ""
    return (
        f"{entry}(): {where}{more} is already compiled with torch.compile, and its compiled "
        "code runs without module hooks: only its outermost call would be recorded. Call "
        f"precguard.{entry}(model) before torch.compile(model) (each module's boundary is "
        "then recorded, docs/capture.md 'torch.compile'), or pass the uncompiled module "
        "(model._orig_mod) instead"
    )


# --------------------------------------------------------------------------- compiled before
# monitor() on an inner module that a torch.compile wrapper has already run (issue 37):
# dynamo keeps the code it compiled without hooks and, not guarding on hooks, runs it again;
# the hooks would see the root's call alone. Its compiled code is dropped instead, so the
# next compiled call retraces it with the hooks (graph breaks at the module boundaries, as
# when monitor() comes before torch.compile) and every module is recorded.

#: dynamo's names for the continuation of a frame after a graph break
_RESUME_PREFIX = "torch_dynamo_resume_in_"


def _forward_codes(model: nn.Module | type[nn.Module]) -> set[Any]:
    """The code objects a call of ``model`` runs as frames dynamo may have compiled: every
    module's ``forward`` (through decorators' ``__wrapped__``, and an instance's own); for
    a module class, its ``forward``."""
    codes = {nn.Module._wrapped_call_impl.__code__, nn.Module._call_impl.__code__}
    if isinstance(model, type):
        forwards: list[Any] = [model.forward]
    else:
        forwards = [
            f for m in model.modules() for f in (type(m).forward, m.__dict__.get("forward"))
        ]
    for fn in forwards:
        if fn is not None:
            seen = 0
            while fn is not None and seen < 8:  # a decorator chain, bounded
                fn = getattr(fn, "_torchdynamo_orig_callable", fn)
                code = getattr(getattr(fn, "__func__", fn), "__code__", None)
                if code is not None:
                    codes.add(code)
                fn, seen = getattr(fn, "__wrapped__", None), seen + 1
    return codes


def drop_compiled_code(model: nn.Module | type[nn.Module]) -> list[str]:
    """Drop the code dynamo compiled for ``model``'s forwards (a module, or a module class:
    its ``forward``); the names of those dropped.

    Nothing to do (and ``torch._dynamo`` not imported) when nothing was compiled in this
    process. When ``model``'s own forward was compiled (a ``torch.compile`` wrapper of it),
    that code and the continuations dynamo made at graph breaks go (they may belong to
    ``model`` and cannot be told apart); otherwise ``model`` may run inlined in a compiled
    parent or function, and every compiled code goes. Code shared with other models (a
    decorator's wrapper, a compiled function) is recompiled for them on their next call:
    a cost, never a change of what is computed.

    :raises UsageError: compiled code was found but this torch offers no way to drop it.
    """
    dynamo = sys.modules.get("torch._dynamo")
    if dynamo is None:
        return []
    try:
        from torch._dynamo import convert_frame
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list, reset_code

        own = _forward_codes(model)
        seen = [c for c in (w() for w in convert_frame.input_codes.seen) if c is not None]
        compiled = [c for c in {*own, *seen} if _debug_get_cache_entry_list(c)]
        if any(c in own for c in compiled):  # a wrapper of model: its code, continuations
            compiled = [c for c in compiled if c in own or c.co_name.startswith(_RESUME_PREFIX)]
        # else model may run inlined in a compiled parent or function that cannot be told
        # from the others: every compiled code goes (what torch._dynamo.reset_code_caches does)
        dropped = []
        with convert_frame.compile_lock:
            for code in compiled:
                reset_code(code)
                dropped.append(getattr(code, "co_qualname", code.co_name))
    except (ImportError, AttributeError, TypeError) as exc:
        raise UsageError(
            "monitor(): torch.compile has run in this process and precguard cannot drop its "
            f"compiled code with this torch ({type(exc).__name__}: {exc}): call "
            "torch._dynamo.reset() before monitor(), or monitor the model before compiling it"
        ) from None
    return sorted(dropped)
