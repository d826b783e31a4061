"""The one way precguard attaches to a model: module calls, ops, gradients, one handle.

Every feature that needs to see (or, for an experiment, change) what a model
computes attaches through this module, capture's own monitor, op capture and
collectives included; a test (``tests/test_hook_layer.py``) holds that no other
module registers a torch hook, subclasses a torch mode, assigns ``.forward`` or
replaces a function by a computed name. The verbs:

* :func:`on_calls` — a callback before and/or after each call of the chosen
  modules (torch's ``register_forward_pre_hook``/``register_forward_hook``);
* :func:`on_ops` — a callback after each torch op run inside the ``with``
  block (a ``TorchFunctionMode``, or ``TorchDispatchMode`` with
  ``level="aten"``), told which module ran it, or a function that runs the op
  in its stead;
* :func:`on_param_grads`, :func:`on_tensor_grad`, :func:`on_node_grad` —
  gradients, once accumulated into a parameter, as they reach a tensor, or as
  one autograd node hands them to its inputs;
* :func:`replace_forward` — a module's calls answered by another function
  (bisect's "this module at reference precision"); :func:`replace_function`
  the same for a module-level function (the collectives of ``torch.distributed``);
* :class:`NonFiniteOrigin` and :func:`has_nonfinite` — the one rule for
  "where did the first NaN/Inf appear": the first call whose output holds one
  while its inputs held none.

Each returns a :class:`HookHandle`: ``remove()`` takes everything off
(idempotent) and leaves the modules exactly as they were; as a context
manager it removes on exit, also when the block raised.

A callback that raises is reported (one ``hook_failed`` log line per module
and hook) and the forward pass goes on as if it had returned None, unless the
caller passes ``errors="raise"`` — what a callback that replaces an input or
an output wants, since a silently skipped replacement would be a wrong
experiment. :class:`~precguard.errors.NonFiniteError` always propagates: it is
how ``on_nonfinite="raise"`` stops a run at the origin.

>>> with on_calls(model, post=lambda name, m, args, kwargs, out: print(name)):
...     model(x)                                                    # doctest: +SKIP

Every callback is kept out of dynamo's tracing (:func:`outside_dynamo`), so a
model run under ``torch.compile`` breaks its graph at the module boundary and
the callback sees real tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Literal

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from precguard._logging import get_logger
from precguard.capture.compiled import outside_dynamo
from precguard.errors import NonFiniteError
from precguard.tree import tensors

logger = get_logger(__name__)

Errors = Literal["report", "raise"]
OpLevel = Literal["function", "aten"]

#: modules that hold others and are never called themselves
CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)

#: which modules :func:`on_calls` attaches to: every one (None), those a predicate on
#: (qualified name, module) accepts, or the ones named
ModuleChoice = Callable[[str, nn.Module], bool] | Iterable[str] | None


class HookHandle:
    """What attaching returns: ``remove()`` (idempotent), and a context manager that removes.

    It holds torch's handles and the undo steps of anything else attached
    (a replaced ``forward``, an entered mode); removing runs all of them, even
    when one fails, and raises the first failure afterwards.
    """

    __slots__ = ("_undo", "removed")

    def __init__(self) -> None:
        self._undo: list[Callable[[], Any]] = []
        #: True once :meth:`remove` ran
        self.removed = False

    def _add(self, undo: Any) -> None:
        """Keep a torch ``RemovableHandle`` (its ``remove``) or an undo callable."""
        self._undo.append(undo.remove if hasattr(undo, "remove") else undo)

    def remove(self) -> None:
        """Take every hook off, newest first. Idempotent."""
        if self.removed:
            return
        self.removed = True
        errors: list[BaseException] = []
        undo, self._undo = self._undo, []
        for step in reversed(undo):
            try:
                step()
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> HookHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


class _Failures:
    """Reports a failing callback once per (module, hook) for one handle's lifetime."""

    __slots__ = ("seen",)

    def __init__(self) -> None:
        self.seen: set[tuple[str, str]] = set()

    def report(self, name: str, where: str, exc: BaseException) -> None:
        if (name, where) in self.seen:
            return
        self.seen.add((name, where))
        logger.error("hook_failed", module=name, hook=where, error=f"{type(exc).__name__}: {exc}")


def module_names(root: nn.Module, root_name: str = "root") -> dict[nn.Module, str]:
    """Map each module under ``root`` to its qualified name; the root is ``root_name``.

    With a root name other than ``root`` (a decorated instance) children are
    prefixed with it: ``LlamaMLP#0.down_proj``. A module reachable by two
    paths keeps its first name.
    """
    names: dict[nn.Module, str] = {}
    for name, mod in root.named_modules():
        if mod in names:
            continue
        if not name:
            names[mod] = root_name
        else:
            names[mod] = name if root_name == "root" else f"{root_name}.{name}"
    return names


def _chosen(root: nn.Module, modules: ModuleChoice, root_name: str) -> list[tuple[str, nn.Module]]:
    names = module_names(root, root_name)
    if modules is None:
        return [(n, m) for m, n in names.items() if not isinstance(m, CONTAINERS)]
    if callable(modules):
        return [(n, m) for m, n in names.items() if modules(n, m)]
    by_name = {n: m for m, n in names.items()}
    chosen = []
    for n in modules:
        if n not in by_name:
            raise KeyError(f"no module named {n!r} under the model (the root is {root_name!r})")
        chosen.append((n, by_name[n]))
    return chosen


#: ``_guard``'s default first argument: the module's name
_NAME = object()


def _guard(
    fn: Callable[..., Any],
    name: str,
    where: str,
    errors: Errors,
    failures: _Failures,
    eager: bool = True,
    first: Any = _NAME,
) -> Callable[..., Any]:
    """``fn`` with ``first`` (default ``name``) passed first; with ``errors="report"`` a raise
    is reported under ``name``, not raised.

    ``eager``: kept out of dynamo (forward hooks; gradient hooks run in autograd's engine,
    outside dynamo's frames, and pass False). One Python frame around ``fn``.
    """
    bound = name if first is _NAME else first
    if errors == "raise":

        def hook(*args: Any) -> Any:
            return fn(bound, *args)

    else:

        def hook(*args: Any) -> Any:
            try:
                return fn(bound, *args)
            except NonFiniteError:
                raise
            except Exception as exc:
                failures.report(name, where, exc)
                return None

    return outside_dynamo(hook) if eager else hook


def on_calls(
    model: nn.Module,
    pre: Callable[..., Any] | None = None,
    post: Callable[..., Any] | None = None,
    *,
    modules: ModuleChoice = None,
    with_kwargs: bool = True,
    root_name: str = "root",
    errors: Errors = "report",
    always_call: bool = False,
    bind: Callable[[str, nn.Module], Any] | None = None,
    name_first: bool = True,
) -> HookHandle:
    """Call ``pre`` before and ``post`` after each call of the chosen modules under ``model``.

    With ``with_kwargs`` (the default) the callbacks are
    ``pre(name, module, args, kwargs)`` and ``post(name, module, args, kwargs, output)``;
    without, ``pre(name, module, args)`` and ``post(name, module, args, output)``.
    ``name`` is the module's qualified name, the root being ``root_name``.
    A callback returns None to leave the call as it is; ``pre`` may return
    replacement inputs (``(args, kwargs)``, or ``args`` without kwargs) and
    ``post`` a replacement output, as torch's hooks do — pass
    ``errors="raise"`` then, so a failed replacement stops the run.

    ``modules``: every module except containers (None), those a predicate
    ``(name, module) -> bool`` accepts, or an iterable of qualified names.
    ``always_call``: run ``post`` also when the module raised (a stack kept
    by ``pre``/``post`` stays balanced). ``bind(name, module)``: what the
    callbacks get first instead of the name, made once per module at
    registration (what a capture resolves once rather than per call).

    ``name_first=False`` with ``errors="raise"``: torch calls ``pre`` and
    ``post`` themselves, with torch's hook arguments alone (no name, nothing
    bound; ``bind`` is then only a set-up run once per module) and no frame of
    this layer between — the cheapest hook there is, for a capture that looks
    its per-module state up itself and catches its own errors.
    """
    if not name_first and errors != "raise":
        raise ValueError("on_calls(name_first=False) needs errors='raise'")
    handle = HookHandle()
    failures = _Failures()

    def hook_of(fn: Callable[..., Any], name: str, where: str, first: Any) -> Callable[..., Any]:
        if not name_first:
            return outside_dynamo(fn)
        return _guard(fn, name, where, errors, failures, first=first)

    try:
        for name, mod in _chosen(model, modules, root_name):
            first = bind(name, mod) if bind is not None else _NAME
            if pre is not None:
                hook = hook_of(pre, name, "forward_pre", first)
                handle._add(mod.register_forward_pre_hook(hook, with_kwargs=with_kwargs))
            if post is not None:
                hook = hook_of(post, name, "forward", first)
                handle._add(
                    mod.register_forward_hook(
                        hook, with_kwargs=with_kwargs, always_call=always_call
                    )
                )
    except BaseException:
        handle.remove()
        raise
    return handle


def on_param_grads(
    params: Iterable[tuple[str, torch.Tensor]],
    hook: Callable[[str, torch.Tensor], None],
    *,
    errors: Errors = "report",
) -> HookHandle:
    """Call ``hook(name, param)`` once ``param.grad`` holds this backward's accumulated gradient.

    ``params``: ``(name, parameter)`` pairs (``model.named_parameters()``); those
    that do not require grad are skipped.
    """
    handle = HookHandle()
    failures = _Failures()
    for name, p in params:
        if p.requires_grad:
            fn = _guard(hook, name, "param_grad", errors, failures, eager=False)
            handle._add(p.register_post_accumulate_grad_hook(fn))
    return handle


def on_tensor_grad(
    t: torch.Tensor,
    hook: Callable[[torch.Tensor], None],
    *,
    name: str = "tensor",
    errors: Errors = "report",
) -> HookHandle:
    """Call ``hook(grad)`` with the gradient w.r.t. ``t`` when backward computes it.

    ``hook`` only observes (its return value is ignored, so the gradient is
    unchanged). The hook of a non-leaf tensor lives as long as its graph;
    ``name`` is what a failure report calls it.
    """
    handle = HookHandle()
    if errors == "raise":  # a capture attaches one per output in training: no guard to build

        def observe(grad: torch.Tensor) -> None:
            hook(grad)

    else:
        guarded = _guard(
            lambda _name, g: hook(g), name, "tensor_grad", errors, _Failures(), eager=False
        )

        def observe(grad: torch.Tensor) -> None:
            guarded(grad)

    handle._add(t.register_hook(observe))
    return handle


def on_node_grad(
    node: Any,
    hook: Callable[[tuple[torch.Tensor | None, ...], tuple[torch.Tensor | None, ...]], None],
    *,
    name: str = "node",
    errors: Errors = "report",
) -> HookHandle:
    """Call ``hook(grad_inputs, grad_outputs)`` when backward runs autograd node ``node``.

    ``grad_inputs`` are the gradients the node hands to its inputs, one per
    edge (:mod:`precguard.capture.grad_edges` finds the edges of a module's own
    graph): a module's own contribution to an input's gradient, before it is
    added to the contributions of other readers. ``hook`` only observes.
    """
    handle = HookHandle()
    guarded = _guard(lambda _name, gi, go: hook(gi, go), name, "node_grad", errors, _Failures())

    def observe(grad_inputs: Any, grad_outputs: Any) -> None:
        guarded(grad_inputs, grad_outputs)

    handle._add(node.register_hook(observe))
    return handle


def replace_function(
    namespace: Any,
    name: str,
    wrapper: Callable[..., Any],
    *,
    shadowed: Callable[[], Any] | None = None,
) -> HookHandle:
    """Answer calls of ``namespace.name`` (a function of a module) with ``wrapper``.

    What the collectives' capture does to ``torch.distributed.all_reduce`` and its
    kin: they are functions, not modules, so no module hook sees them.
    Removing puts the original back, unless someone replaced ``wrapper`` in turn
    since; then it stays (it calls ours, which must pass through by then) and
    ``shadowed()`` is called to say so.
    """
    original = getattr(namespace, name)
    setattr(namespace, name, wrapper)
    handle = HookHandle()

    def restore() -> None:
        if getattr(namespace, name) is wrapper:
            setattr(namespace, name, original)
        elif shadowed is not None:
            shadowed()

    handle._add(restore)
    return handle


def replace_forward(module: nn.Module, forward: Callable[..., Any]) -> HookHandle:
    """Answer every call of ``module`` with ``forward(*args, **kwargs)``; removing restores it.

    Hooks on ``module`` itself still run around the call. This swaps the
    module's ``forward`` (an instance attribute, deleted again on removal,
    or the user's own instance attribute put back): a post-hook that returns
    a replacement output would run the module's own forward first — on the
    device under test, at twice the cost, with its submodules' hooks seeing a
    call whose result is thrown away and its side effects (a KV cache's
    update, an overflow warning) happening twice.
    """
    had = "forward" in module.__dict__
    old = module.__dict__.get("forward")
    module.forward = forward  # type: ignore[method-assign]
    handle = HookHandle()

    def restore() -> None:
        if had:
            module.forward = old  # type: ignore[method-assign]
        else:
            module.__dict__.pop("forward", None)

    handle._add(restore)
    return handle


# -- ops -----------------------------------------------------------------------------------


def _plain(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return func(*args, **kwargs)


class _OpWatch:
    """What ``on_ops(post=...)`` runs for each op: the op, then ``post`` if it is watched."""

    def __init__(
        self,
        post: Callable[[str, tuple, dict, Any, str], None],
        ops: frozenset[str] | None,
        run: Callable[[Any, tuple, dict], Any],
        stack: list[str],
        errors: Errors,
        name_of: Callable[[Any], str],
    ) -> None:
        self.post = post
        self.ops = ops
        self.run = run
        self.stack = stack
        self.errors = errors
        self.name_of = name_of
        self.failures = _Failures()

    def call(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = self.run(func, args, kwargs)
        name = self.name_of(func)
        if self.ops is None or name in self.ops:
            module = self.stack[-1] if self.stack else "root"
            try:
                self.post(name, args, kwargs, result, module)
            except NonFiniteError:
                raise
            except Exception as exc:
                if self.errors == "raise":
                    raise
                self.failures.report(module, f"op {name}", exc)
        return result


def _function_name(func: Any) -> str:
    return getattr(func, "__name__", "")


def _aten_name(func: Any) -> str:
    return func.overloadpacket.__name__


#: an op's interception: ``intercept(func, args, kwargs)`` returns the op's result
Intercept = Callable[[Any, tuple, dict], Any]


class _FunctionLevel(TorchFunctionMode):
    def __init__(self, intercept: Intercept) -> None:
        super().__init__()
        self.intercept = intercept

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        return self.intercept(func, args, kwargs or {})


class _AtenLevel(TorchDispatchMode):
    def __init__(self, intercept: Intercept) -> None:
        super().__init__()
        self.intercept = intercept

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        return self.intercept(func, args, kwargs or {})


class OpsHandle(HookHandle):
    """The handle of :func:`on_ops`: entering it starts watching ops; leaving removes it all.

    Enter it inside the device's numerics context (an ``emu:`` mode, the fp64
    oracle) so that callbacks see the values the device computed. A handle
    is entered once; ``remove()`` also leaves a mode still entered.
    """

    __slots__ = ("_entered", "_mode")

    def __init__(self, mode: TorchFunctionMode | TorchDispatchMode) -> None:
        super().__init__()
        self._mode = mode
        self._entered = False

    def __enter__(self) -> OpsHandle:
        if self.removed or self._entered:
            raise RuntimeError("an on_ops() handle is entered once, before it is removed")
        self._mode.__enter__()
        self._entered = True
        self._add(lambda: self._mode.__exit__(None, None, None))
        return self


def on_ops(
    post: Callable[[str, tuple, dict, Any, str], None] | None = None,
    *,
    model: nn.Module | None = None,
    ops: Iterable[str] | None = None,
    level: OpLevel = "function",
    run: Callable[[Any, tuple, dict], Any] | None = None,
    root_name: str = "root",
    errors: Errors = "report",
) -> OpsHandle:
    """Watch the torch ops run inside ``with on_ops(...):``; optionally run them another way.

    ``post(op, args, kwargs, result, module)`` is called after each op named in
    ``ops`` (every op if None) with its result, untouched. ``op`` is the name
    the code called (``softmax``, ``__matmul__``) at ``level="function"``
    (a ``TorchFunctionMode``: what the model's code calls), the aten op's name
    (``_softmax``, ``mm``) at ``level="aten"`` (a ``TorchDispatchMode``: what
    the dispatcher ran, after decompositions and autocast's casts).
    ``module`` is the qualified name of the innermost module of ``model``
    running when ``model`` is given (its calls are hooked for that), else
    ``"root"``. ``run(func, args, kwargs)`` computes each op's result in place
    of ``func(*args, **kwargs)`` (an experiment: another reduction order); it is
    the model's result, so its errors always propagate. Without ``post``, ``run``
    is the whole interception (op capture's: it names the op and records it).
    """
    stack: list[str] = []
    intercept: Intercept = run or _plain
    if post is not None:  # without one, the op goes to ``run`` with no frame between
        watch = _OpWatch(
            post,
            frozenset(ops) if ops is not None else None,
            intercept,
            stack,
            errors,
            _aten_name if level == "aten" else _function_name,
        )
        intercept = watch.call
    mode = _AtenLevel(intercept) if level == "aten" else _FunctionLevel(intercept)
    handle = OpsHandle(mode)
    if model is not None:

        def push(name: str, _m: nn.Module, _args: Any) -> None:
            stack.append(name)

        def pop(_name: str, _m: nn.Module, _args: Any, _out: Any) -> None:
            if stack:
                stack.pop()

        calls = on_calls(
            model,
            push,
            pop,
            modules=lambda _n, _m: True,
            with_kwargs=False,
            root_name=root_name,
            always_call=True,
        )
        handle._add(calls)
    return handle


# -- the origin of a NaN/Inf -------------------------------------------------------------


def has_nonfinite(value: Any) -> bool:
    """True when a floating-point tensor anywhere in ``value`` holds a NaN or an Inf."""
    return any(t.is_floating_point() and not bool(torch.isfinite(t).all()) for t in tensors(value))


class NonFiniteOrigin:
    """The first call whose output holds a NaN/Inf while its inputs held none.

    The one rule of every place that names where a NaN/Inf appeared: the
    recording (from statistics records), the ``grads`` check and bisect's
    overflow search (from live module calls). Feed it in call order: the
    inputs of a call as they are seen (:meth:`inputs`, any number of times
    per call), then its output (:meth:`output`), which says whether this call
    is the origin. A call's inputs are finite unless said otherwise. In a
    backward pass there are no inputs to speak of: the first bad gradient is
    the origin (:meth:`first`). One origin per phase until :meth:`reset`.
    """

    __slots__ = ("_inputs_finite", "found")

    def __init__(self) -> None:
        self._inputs_finite: dict[Any, bool] = {}
        #: phase -> the key of its origin
        self.found: dict[str, Any] = {}

    def inputs(self, call: Any, finite: bool) -> None:
        """Note inputs of ``call`` (any hashable key): all finite, or not."""
        self._inputs_finite[call] = self._inputs_finite.get(call, True) and finite

    def output(self, call: Any, finite: bool, phase: str = "forward") -> bool:
        """Note an output of ``call``; True when it is the phase's origin (the first)."""
        if finite or phase in self.found or not self._inputs_finite.get(call, True):
            return False
        self.found[phase] = call
        return True

    def call(
        self, call: Any, inputs_finite: bool, output_finite: bool, phase: str = "forward"
    ) -> bool:
        """Note a call seen whole (a post-hook has both); True when it is the phase's origin."""
        if output_finite or phase in self.found or not inputs_finite:
            return False
        self.found[phase] = call
        return True

    def first(self, key: Any, finite: bool, phase: str = "backward") -> bool:
        """Note a value with no inputs to blame; True when it is the phase's first bad one."""
        if finite or phase in self.found:
            return False
        self.found[phase] = key
        return True

    def reset(self) -> None:
        """Forget everything: the next step's origin is looked for afresh."""
        self._inputs_finite.clear()
        self.found.clear()
