"""Module hooks that feed a :class:`Recording`.

Hooks are registered with torch's own ``register_forward_pre_hook`` /
``register_forward_hook`` (with kwargs), tensor ``register_hook`` for the
gradients of module outputs, and ``register_post_accumulate_grad_hook`` for
parameter gradients. No hook returns a value, so the model computes exactly
what it computes without precguard. A hook that fails logs one error per
module and lets the forward pass go on.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from precguard._logging import get_logger
from precguard.capture.flatten import named_tensors
from precguard.capture.options import CaptureOptions
from precguard.capture.recording import CallFrame, Recording
from precguard.errors import NonFiniteError

logger = get_logger(__name__)

_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.ParameterList, nn.ParameterDict)


def module_names(root: nn.Module, root_name: str = "root") -> dict[nn.Module, str]:
    """Map each module under ``root`` to its qualified name; the root is ``root_name``.

    With a root name other than ``root`` (a decorated instance) children are
    prefixed with it: ``LlamaMLP#0.down_proj``.
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
        self._handles: list[RemovableHandle] = []
        # per module: a stack of open calls (None where the call is not recorded)
        self._frames: dict[int, list[tuple[Recording, CallFrame] | None]] = {}
        self._failed: set[tuple[str, str]] = set()
        self.removed = False
        self.names = module_names(root, root_name)
        for mod, name in self.names.items():
            if isinstance(mod, _CONTAINERS):
                continue
            if covers and self._fixed_sink is not None:
                self._fixed_sink.covered.add(id(mod))
            info = (name, type(mod).__name__, options.saves(name), mod is root, not covers)
            self._handles.append(
                mod.register_forward_pre_hook(functools.partial(self._pre, info), with_kwargs=True)
            )
            self._handles.append(
                mod.register_forward_hook(functools.partial(self._post, info), with_kwargs=True)
            )
            if options.backward:
                for index, (pname, p) in enumerate(mod.named_parameters(recurse=False)):
                    if p.requires_grad:
                        hook = functools.partial(
                            self._param_grad, name, type(mod).__name__, index, pname
                        )
                        self._handles.append(p.register_post_accumulate_grad_hook(hook))

    # -- hooks -------------------------------------------------------------------------

    def _report_failure(self, name: str, where: str, exc: BaseException) -> None:
        if (name, where) in self._failed:
            return
        self._failed.add((name, where))
        logger.error("hook_failed", module=name, hook=where, error=f"{type(exc).__name__}: {exc}")

    def _resolve(self, module: nn.Module, skip_covered: bool) -> Recording | None:
        sink = self._sink_fn()
        if sink is None or sink.closed:
            return None
        if skip_covered and id(module) in sink.covered:
            return None  # a monitor() on an enclosing model already records this module
        return sink

    def _pre(
        self,
        info: tuple[str, str, bool, bool, bool],
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> None:
        name, mtype, save, is_root, skip_covered = info
        if self.removed:
            return
        opened: tuple[Recording, CallFrame] | None = None
        try:
            sink = self._resolve(module, skip_covered)
            if sink is not None:
                items = named_tensors(args, "args") + named_tensors(kwargs, "kwargs")
                frame = sink.enter(
                    module,
                    name,
                    mtype,
                    items,
                    root=is_root,
                    save=save,
                    on_nonfinite=self.options.on_nonfinite,
                )
                opened = (sink, frame)
                self._record_params(sink, module, frame)
        except Exception as exc:
            self._report_failure(name, "forward_pre", exc)
        # always push, so that the post-hook pops the frame of its own call
        self._frames.setdefault(id(module), []).append(opened)

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

    def _post(
        self,
        info: tuple[str, str, bool, bool, bool],
        module: nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        output: Any,
    ) -> None:
        name, mtype, _, is_root, _ = info
        stack = self._frames.get(id(module))
        opened = stack.pop() if stack else None
        if opened is None or self.removed:
            return
        sink, frame = opened
        try:
            items = named_tensors(output, "output")
            sink.leave(frame, items)
            if self.options.backward and torch.is_grad_enabled():
                for index, (tname, t) in enumerate(items):
                    if t.requires_grad:
                        t.register_hook(
                            functools.partial(
                                self._output_grad, sink, name, mtype, frame.call, index, tname
                            )
                        )
            if is_root:
                sink.flush()
        except NonFiniteError:
            raise
        except Exception as exc:
            self._report_failure(name, "forward", exc)

    def _output_grad(
        self,
        sink: Recording,
        name: str,
        mtype: str,
        call: int,
        index: int,
        tname: str,
        grad: torch.Tensor,
    ) -> None:
        if self.removed or sink.closed:
            return
        try:
            sink.add(name, mtype, call, "backward", "output", [(tname, grad)], first_index=index)
        except Exception as exc:
            self._report_failure(name, "backward", exc)

    def _param_grad(self, name: str, mtype: str, index: int, pname: str, p: torch.Tensor) -> None:
        if self.removed or p.grad is None:
            return
        sink = self._sink_fn()
        if sink is None or sink.closed:
            return
        try:
            sink.add(name, mtype, 0, "backward", "grad", [(pname, p.grad)], first_index=index)
        except Exception as exc:
            self._report_failure(name, "param_grad", exc)

    # -- lifecycle ---------------------------------------------------------------------

    def remove(self) -> None:
        """Remove every hook. Idempotent; leaves the modules exactly as they were."""
        if self.removed:
            return
        self.removed = True
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._frames.clear()
        if self._fixed_sink is not None:
            for mod in self.names:
                self._fixed_sink.covered.discard(id(mod))
