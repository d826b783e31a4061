"""Module hooks that feed a :class:`Recording`.

Hooks are attached through :mod:`precguard.capture.hooks`: ``on_calls`` (torch's
forward pre- and post-hooks, with kwargs), ``on_tensor_grad`` and
``on_node_grad`` for the gradients of module outputs and inputs, and
``on_param_grads`` for parameter gradients; one :class:`HookHandle` holds them
all. No hook returns a value, so the model computes exactly what it computes without
precguard. A hook that fails logs one error per module and lets the forward
pass go on.

Input gradients are observed without adding a node to the graph, not with
``register_full_backward_hook``: that wraps inputs and outputs in an
identity autograd node, which (a) adds up the gradient contributions of a
module's uses of an input before they meet the uses outside it, changing the
order of a floating-point sum and so the gradients themselves in the last
bit, (b) makes in-place ops on the wrapped tensors an error, and (c) sees
only positional arguments. Instead:

* a leaf module (a Linear, a norm) gets hooks on the nodes of its own graph
  that hand gradient to its inputs (:mod:`precguard.capture.grad_edges`):
  its own contribution, exactly, also when siblings (``q_proj``, ``k_proj``,
  ``v_proj``) or a residual add read the same tensor;
* a module with submodules gets a tensor hook on each input: the gradient
  w.r.t. the tensor, the sum over every use of it. That is the module's own
  input gradient when no module outside it reads the tensor (plain code in
  the enclosing module, such as a residual add, is taken as exact). When
  sibling modules read it, no module alone produced the sum, so it is
  recorded only for the modules that enclose all of its readers, never
  charged to one of them.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precguard._logging import get_logger
from precguard.capture.flatten import named_tensors
from precguard.capture.grad_edges import consumer_edges
from precguard.capture.hooks import (
    HookHandle,
    module_names,
    on_calls,
    on_node_grad,
    on_param_grads,
    on_tensor_grad,
)
from precguard.capture.kv_cache import CacheStates, caches_in, caches_out
from precguard.capture.options import CaptureOptions
from precguard.capture.recording import CallFrame, Recording
from precguard.errors import NonFiniteError

logger = get_logger(__name__)


@dataclass
class _Reader:
    """One module call that read a tensor: where its input gradient is recorded."""

    sink: Recording
    module: str
    module_type: str
    call: int
    index: int
    name: str
    save: bool
    #: its own contribution is recorded from its graph's edges (a leaf module), so the
    #: tensor's whole gradient is not charged to it
    exact: bool = False


@dataclass
class _OwnInputGrads:
    """A leaf module call's own input gradients, gathered from the edges of its graph."""

    readers: list[_Reader]
    expected: list[int]
    parts: list[list[torch.Tensor | None]]


@dataclass
class _InputGradWatch:
    """The tensor hook of one forward input tensor and the module calls that read it."""

    ref: weakref.ref[torch.Tensor]
    leaf: bool
    readers: list[_Reader] = field(default_factory=list)


def _encloses(outer: str, inner: str, root_name: str) -> bool:
    """True when module ``inner`` lies strictly inside ``outer``."""
    return outer != inner and (outer == root_name or inner.startswith(outer + "."))


def attributable_readers(readers: list[_Reader], root_name: str = "root") -> list[_Reader]:
    """The readers of a tensor whose input gradient is that tensor's whole gradient.

    A reader qualifies when every other reader is nested with it (inside it,
    around it, or the same call): then no sibling module added its own
    contribution to the gradient it would be charged with.
    """

    def nested(a: _Reader, b: _Reader) -> bool:
        if a.module == b.module:
            return a.call == b.call
        return _encloses(a.module, b.module, root_name) or _encloses(b.module, a.module, root_name)

    return [r for r in readers if all(nested(r, o) for o in readers)]


#: an open call: its sink, its frame, and its inputs that require grad as
#: (index among the inputs, name, tensor, its version counter at the call)
_Open = tuple[Recording, CallFrame, list[tuple[int, str, torch.Tensor, int]]]


class _Site:
    """One hooked module: what its hooks need, resolved once at registration.

    It holds no strong reference to the module: hooks live on the module, so a
    reference back would keep the model alive through C++-held parameter
    hooks that the garbage collector cannot see.
    """

    __slots__ = ("frames", "leaf", "module", "name", "root", "save", "skip_covered", "type")

    def __init__(
        self,
        module: nn.Module,
        name: str,
        mtype: str,
        save: bool,
        root: bool,
        skip_covered: bool,
        leaf: bool,
    ) -> None:
        #: the hooked module, weakly: a hook called with another module (a deep copy of the
        #: model carries the hooks over) finds no site and records nothing
        self.module = weakref.ref(module)
        self.name = name
        self.type = mtype
        self.save = save
        self.root = root
        #: a decorated instance's hooks: skip a module a monitor() already records
        self.skip_covered = skip_covered
        #: no submodules: its own input gradients come from its graph's edges
        self.leaf = leaf
        #: open calls, innermost last (None where the call is not recorded)
        self.frames: list[_Open | None] = []


class Monitor:
    """Hooks on every module under ``root`` that write into a sink.

    ``sink`` is a fixed :class:`Recording` or a callable that returns the
    sink to use at call time (the active recording of a decorated module),
    or None to skip.
    """

    def __init__(
        self,
        root: nn.Module,
        sink: Recording | Callable[[], Recording | None],
        options: CaptureOptions,
        *,
        root_name: str = "root",
        covers: bool = True,
    ) -> None:
        self.options = options
        self._sink_fn: Callable[[], Recording | None] = (
            (lambda: sink) if isinstance(sink, Recording) else sink
        )
        self._fixed_sink = sink if isinstance(sink, Recording) else None
        #: the hooks that outlive a step: parameter gradients, leaf inputs' gradients
        self._grad_hooks = HookHandle()
        self._failed: set[tuple[str, str]] = set()
        # id(tensor) -> the input-gradient hook on that tensor, one per tensor however
        # many modules read it; entries leave when the gradient arrives or the tensor dies
        self._input_grads: dict[int, _InputGradWatch] = {}
        self._root_name = root_name
        self._backward = options.backward
        self._watch_inputs = options.backward and options.input_grads
        self._on_nonfinite = options.on_nonfinite
        self._params_on = options.params != "never"
        self._params_every = options.params == "every_step"
        self._caches = CacheStates() if options.kv_cache else None
        self.removed = False
        names = module_names(root, root_name)
        #: module -> qualified name; weak, so that the monitor (or a handle on it that
        #: the user keeps) never keeps a model alive
        self.names: weakref.WeakKeyDictionary[nn.Module, str] = weakref.WeakKeyDictionary(names)
        self._covered: list[int] = []
        #: id(module) -> its site, for the hooks; a site's weak reference tells its module
        #: from another that has the id now (a copy's, or one made after the module died)
        self._site_of: dict[int, _Site] = {}
        self._hooks = on_calls(
            root,
            self._pre,
            self._post,
            root_name=root_name,
            # the Monitor's hooks catch their own errors, per module and hook, and push a
            # frame even when the pre-hook failed: no wrapper of the layer around them, and
            # each looks its module's site up itself (a dict read, not a frame)
            errors="raise",
            name_first=False,
            bind=functools.partial(self._site, root, covers),
        )

    def __deepcopy__(self, memo: dict[int, Any]) -> Monitor:
        """The monitor itself: ``copy.deepcopy(model)`` copies the hooks' bound methods, and a
        deep copy of the monitor (its recording, its files) is never what is meant; the
        copy's modules are not this monitor's, so their calls are not recorded."""
        return self

    def _site(self, root: nn.Module, covers: bool, name: str, mod: nn.Module) -> _Site:
        """Resolve once what the hooks of ``mod`` need; hook its parameters' gradients."""
        options = self.options
        if covers and self._fixed_sink is not None:
            self._fixed_sink.covered.add(id(mod))
            self._covered.append(id(mod))
        mtype = type(mod).__name__
        site = _Site(
            mod,
            name,
            mtype,
            options.saves(name),
            mod is root,
            not covers,
            next(mod.children(), None) is None,
        )
        self._site_of[id(mod)] = site
        if options.backward:
            for index, named in enumerate(mod.named_parameters(recurse=False)):
                hook = functools.partial(self._param_grad, name, mtype, index, site.save)
                self._grad_hooks._add(on_param_grads([named], hook, errors="raise"))
        return site

    # -- hooks -------------------------------------------------------------------------

    def _report_failure(self, name: str, where: str, exc: BaseException) -> None:
        if (name, where) in self._failed:
            return
        self._failed.add((name, where))
        logger.error("hook_failed", module=name, hook=where, error=f"{type(exc).__name__}: {exc}")

    def _resolve(self, module: nn.Module, skip_covered: bool) -> Recording | None:
        sink = self._fixed_sink if self._fixed_sink is not None else self._sink_fn()
        if sink is None or sink.closed:
            return None
        if skip_covered and id(module) in sink.covered:
            return None  # a monitor() on an enclosing model already records this module
        return sink

    def _pre(self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        site = self._site_of.get(id(module))
        if site is None or site.module() is not module or self.removed:
            return  # removed, or a module this monitor does not hook (a deep copy's)
        opened: _Open | None = None
        recomputing = _GRAPH_TASK_ID() != -1  # _in_backward(), inlined: once per call
        frames = site.frames
        if not recomputing:
            # a recomputation that checkpointing stopped early (non-reentrant stops once
            # it has the tensors it needs) never reached its post-hook: drop its frame,
            # or each step would leave one holding the recomputed inputs
            while frames and frames[-1] is not None and frames[-1][1].recomputed:
                frames.pop()
        try:
            sink = self._fixed_sink
            if sink is None or site.skip_covered:
                sink = self._resolve(module, site.skip_covered)
            elif sink.closed:
                sink = None
            if sink is not None:
                # a module called with one tensor (most): its name without the walk
                if len(args) == 1 and isinstance(args[0], torch.Tensor):
                    items = [("args.0", args[0])]
                else:
                    items = named_tensors(args, "args")
                if kwargs:
                    items += named_tensors(kwargs, "kwargs")
                if self._caches is not None and not recomputing:
                    # a cache handed in whose state was never recorded (prefilled before)
                    items += self._caches.unseen(caches_in(args, kwargs))
                if recomputing:  # activation checkpointing recomputes this call
                    frame = sink.recompute(
                        module,
                        site.name,
                        site.type,
                        save=site.save,
                        on_nonfinite=self._on_nonfinite,
                    )
                else:
                    frame = sink.enter(
                        module,
                        site.name,
                        site.type,
                        items,
                        # the root called from inside its own forward (recursion) is one
                        # more call of this step, as a child's recursion is, not the next
                        root=site.root and not frames,
                        save=site.save,
                        on_nonfinite=self._on_nonfinite,
                    )
                needs_grad = (
                    [(i, n, t, t._version) for i, (n, t) in enumerate(items) if t.requires_grad]
                    if self._watch_inputs and torch.is_grad_enabled()
                    else []
                )
                opened = (sink, frame, needs_grad)
                # parameters at a module's first call of a step (the policy's gate inlined)
                if (
                    frame.call == 0
                    and not frame.recomputed
                    and self._params_on
                    and (self._params_every or sink.step_index == 0)
                ):
                    self._record_params(sink, module, frame)
        except Exception as exc:
            self._report_failure(site.name, "forward_pre", exc)
        # always push, so that the post-hook pops the frame of its own call
        frames.append(opened)

    def _record_params(self, sink: Recording, module: nn.Module, frame: CallFrame) -> None:
        # call 0 happens once per module and step, so each step records them at most once
        policy = self.options.params
        if policy == "never" or frame.call != 0:
            return
        if policy == "first_step" and sink.step_index != 0:
            return
        params = list(module.named_parameters(recurse=False))
        if params:
            sink.add(
                frame.module, frame.module_type, 0, "forward", "param", params, save=frame.save
            )
        # what the module reads besides its arguments and weights (a rotary embedding's
        # inv_freq, non-persistent ones included): compare names a buffer that differs
        buffers = [(n, b) for n, b in module.named_buffers(recurse=False) if b is not None]
        if buffers:
            sink.add(
                frame.module, frame.module_type, 0, "forward", "buffer", buffers, save=frame.save
            )

    def _post(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any
    ) -> None:
        site = self._site_of.get(id(module))
        if site is None or site.module() is not module:
            return  # the pre-hook returned at once too
        frames = site.frames
        opened = frames.pop() if frames else None
        if opened is None or self.removed:
            return
        sink, frame, needs_grad = opened
        name, mtype = site.name, site.type
        try:
            items = (
                [("output", output)]
                if isinstance(output, torch.Tensor)
                else named_tensors(output, "output")
            )
            if not frame.recomputed:
                if self._caches is not None:  # cache tensors this call wrote
                    found = caches_in(args, kwargs) + caches_out(output)
                    sink.leave(frame, items + self._caches.unseen(found))
                elif frame.on_nonfinite == "record":
                    # Recording.leave, inlined: with "record" it only adds the outputs
                    sink.add(name, mtype, frame.call, "forward", "output", items, save=frame.save)
                else:
                    sink.leave(frame, items)
            if self._backward and torch.is_grad_enabled():
                for index, (tname, t) in enumerate(items):
                    if t.requires_grad:  # lives with the graph: no handle kept
                        on_tensor_grad(
                            t,
                            functools.partial(
                                self._output_grad,
                                sink,
                                name,
                                mtype,
                                frame.call,
                                index,
                                tname,
                                frame.save,
                            ),
                            errors="raise",
                        )
            if needs_grad:
                self._watch_inputs_of(site, items, needs_grad, sink, frame)
            if site.root and not frames and not frame.recomputed:  # the outermost root call
                sink.flush()
        except NonFiniteError:
            raise
        except Exception as exc:
            self._report_failure(name, "forward", exc)

    def _watch_inputs_of(
        self,
        site: _Site,
        outputs: list[tuple[str, torch.Tensor]],
        needs_grad: list[tuple[int, str, torch.Tensor, int]],
        sink: Recording,
        frame: CallFrame,
    ) -> None:
        """Hook the inputs of a finished call that require grad, for their gradients."""
        # Registered after the call, so a module's readers are listed innermost
        # first (children finish before their parent), the order they are recorded in.
        # A call none of whose outputs requires grad adds nothing to its inputs'
        # gradients (rotary_emb reads hidden_states only for its dtype): not a reader.
        if not any(t.requires_grad for _, t in outputs):
            return
        # modified in place (ReLU(inplace=True)): the tensor's gradient is now that of
        # the result; its input's is beyond a hook that changes nothing
        needs_grad = [x for x in needs_grad if x[2]._version == x[3]]
        readers = [
            _Reader(sink, site.name, site.type, frame.call, index, tname, frame.save)
            for index, tname, _, _ in needs_grad
        ]
        watched: list[_Reader | None] = list(readers)
        if readers and site.leaf:
            watched = self._watch_own_edges(outputs, needs_grad, readers)
        for (_, _, t, _), reader in zip(needs_grad, watched, strict=True):
            if reader is not None:
                self._watch_input(t, reader)

    def _output_grad(
        self,
        sink: Recording,
        name: str,
        mtype: str,
        call: int,
        index: int,
        tname: str,
        save: bool,
        grad: torch.Tensor,
    ) -> None:
        if self.removed or sink.closed:
            return
        try:
            sink.add(
                name,
                mtype,
                call,
                "backward",
                "output",
                [(tname, grad)],
                first_index=index,
                save=save,
            )
        except Exception as exc:
            self._report_failure(name, "backward", exc)

    def _watch_input(self, t: torch.Tensor, reader: _Reader) -> None:
        """Add ``reader`` to the gradient hook of input ``t``, registering it on first use.

        A non-leaf tensor's hook lives as long as its graph: one per tensor and
        step. A leaf (a parameter or a user tensor passed in as an input) keeps
        its hooks across steps, so it gets one hook for the monitor's lifetime,
        removed with the others.
        """
        key = id(t)
        watch = self._input_grads.get(key)
        if watch is None or watch.ref() is not t:

            def forget(ref: weakref.ref[torch.Tensor], key: int = key) -> None:
                current = self._input_grads.get(key)
                if current is not None and current.ref is ref:
                    del self._input_grads[key]

            watch = _InputGradWatch(weakref.ref(t, forget), leaf=t.grad_fn is None)
            self._input_grads[key] = watch
            handle = on_tensor_grad(
                t, functools.partial(self._input_grad, key, watch), errors="raise"
            )
            if watch.leaf:
                self._grad_hooks._add(handle)
        watch.readers.append(reader)

    def _watch_own_edges(
        self,
        outputs: list[tuple[str, torch.Tensor]],
        needs_grad: list[tuple[int, str, torch.Tensor, int]],
        readers: list[_Reader],
    ) -> list[_Reader | None]:
        """Hook a leaf module's graph where it hands gradient to its inputs.

        Returns the readers to register on the input tensors: marked ``exact``
        where the module's own contribution is hooked, None for an input its
        graph does not reach (it adds nothing to that input's gradient).
        """
        edges = consumer_edges(
            [t for _, t in outputs if t.requires_grad], [t for _, _, t, _ in needs_grad]
        )
        if edges is None:
            return list(readers)
        own = _OwnInputGrads(readers, [len(e) for e in edges], [[] for _ in edges])
        by_node: dict[Any, list[tuple[int, int]]] = {}
        for k, node_edges in enumerate(edges):
            for node, i in node_edges:
                by_node.setdefault(node, []).append((k, i))
        for node, pairs in by_node.items():
            on_node_grad(node, functools.partial(self._edge_grad, own, pairs), errors="raise")
        out: list[_Reader | None] = []
        for reader, node_edges in zip(readers, edges, strict=True):
            reader.exact = bool(node_edges)
            out.append(reader if node_edges else None)
        return out

    def _edge_grad(
        self,
        own: _OwnInputGrads,
        pairs: list[tuple[int, int]],
        grad_inputs: tuple[torch.Tensor | None, ...],
        _grad_outputs: tuple[torch.Tensor | None, ...],
    ) -> None:
        for k, i in pairs:
            parts = own.parts[k]
            parts.append(grad_inputs[i])
            if len(parts) < own.expected[k]:
                continue
            own.parts[k] = []
            r = own.readers[k]
            if self.removed or r.sink.closed:
                continue
            try:
                got = [g for g in parts if g is not None]
                if not got:
                    continue
                with torch.no_grad():
                    grad = functools.reduce(torch.add, got)
                _add_input_grad(r, grad)
            except Exception as exc:
                self._report_failure(r.module, "input_grad", exc)

    def _input_grad(self, key: int, watch: _InputGradWatch, grad: torch.Tensor) -> None:
        readers, watch.readers = watch.readers, []
        if not watch.leaf and self._input_grads.get(key) is watch:
            del self._input_grads[key]
        if self.removed:
            return
        for r in attributable_readers(readers, self._root_name):
            if r.exact or r.sink.closed:
                continue
            try:
                _add_input_grad(r, grad)
            except Exception as exc:
                self._report_failure(r.module, "input_grad", exc)

    def _param_grad(
        self, name: str, mtype: str, index: int, save: bool, pname: str, p: torch.Tensor
    ) -> None:
        if self.removed or p.grad is None:
            return
        grad = p.grad
        if hasattr(grad, "to_local") and hasattr(grad, "placements"):
            # a DTensor (FSDP2, tensor parallel): record this rank's shard; its statistics
            # as a whole mix local values with the global numel, and safetensors cannot
            # save it. compare --layout puts the shards back together.
            grad = grad.to_local()
        sink = self._sink_fn()
        if sink is None or sink.closed:
            return
        try:
            sink.add(
                name,
                mtype,
                0,
                "backward",
                "grad",
                [(pname, grad)],
                first_index=index,
                save=save,
            )
        except Exception as exc:
            self._report_failure(name, "param_grad", exc)

    # -- lifecycle ---------------------------------------------------------------------

    def remove(self) -> None:
        """Remove every hook. Idempotent; leaves the modules exactly as they were."""
        if self.removed:
            return
        self.removed = True
        try:
            self._hooks.remove()
        finally:
            self._grad_hooks.remove()
        for site in self._site_of.values():
            site.frames.clear()
        self._input_grads.clear()
        if self._fixed_sink is not None:
            self._fixed_sink.covered.difference_update(self._covered)


#: the id of the backward pass running in this thread, -1 outside backward
_GRAPH_TASK_ID = getattr(torch._C, "_current_graph_task_id", lambda: -1)


def _in_backward() -> bool:
    """Whether a forward runs inside a backward pass: activation checkpointing recomputing it.

    Both ``torch.utils.checkpoint`` flavours (and HF's ``gradient_checkpointing_enable``,
    built on it) run the recomputation from autograd's engine: non-reentrant from a
    saved tensor's unpack hook, reentrant from ``CheckpointFunction.backward``.
    """
    return _GRAPH_TASK_ID() != -1


def _add_input_grad(reader: _Reader, grad: torch.Tensor) -> None:
    """Record ``grad`` as ``reader``'s gradient w.r.t. the input it read (``backward.input``)."""
    reader.sink.add(
        reader.module,
        reader.module_type,
        reader.call,
        "backward",
        "input",
        [(reader.name, grad)],
        first_index=reader.index,
        save=reader.save,
    )
