"""One hook layer: no module but ``capture/hooks.py`` attaches to a model on its own.

Every feature sees a model's calls, ops and gradients through
:mod:`precguard.capture.hooks` (``on_calls``, ``on_ops``, ``on_param_grads``,
``on_tensor_grad``, ``on_node_grad``, ``replace_forward``,
``replace_function``), so hook discipline (handles removed, a failing callback
reported, dynamo kept out) lives in one place. That holds inside ``capture/``
too: the monitor, op capture and the collectives attach through it. This test
reads the source with ``ast`` and fails on a module other than ``hooks.py``
that

* calls a ``register_*hook*`` function or method (module, tensor, parameter,
  autograd node, global module hooks),
* defines a class based on ``TorchFunctionMode`` / ``TorchDispatchMode`` or
  one with a ``__torch_function__`` / ``__torch_dispatch__`` method,
* assigns a ``forward`` attribute (``module.forward = ...``,
  ``setattr(module, "forward", ...)``),
* replaces an attribute named at run time (``setattr(namespace, name, wrapper)``:
  how a library's functions are patched).
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "precguard"

#: module (relative to src/precguard) -> why it may attach on its own. A mode that *is* a
#: device's arithmetic is no instrumentation: the ``emu:`` emulator and the fp64 oracle sit
#: below capture/ in the layers (capture records what they compute; tests/test_layering.py)
KNOWN_EXCEPTIONS: dict[str, str] = {
    "backends/emu/mode.py": "EmuMode is the emu: device's numerics, a layer below capture",
    "oracle.py": "Fp64Mode is the fp64 reference device's numerics, a layer below capture",
}

_REGISTER = re.compile(r"^register_\w*hook\w*$")
_MODES = {"TorchFunctionMode", "TorchDispatchMode"}
_INTERCEPTORS = {"__torch_function__", "__torch_dispatch__"}


def _name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def attachments(source: str) -> list[str]:
    """What ``source`` attaches on its own: one ``line N: what`` entry per place."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            called = _name(node.func)
            if called is not None and _REGISTER.match(called):
                found.append(f"line {node.lineno}: calls {called}")
            elif called == "setattr" and len(node.args) >= 2:
                if not isinstance(node.args[1], ast.Constant):
                    found.append(f"line {node.lineno}: setattr with a computed name")
                elif node.args[1].value == "forward":
                    found.append(f"line {node.lineno}: setattr(..., 'forward', ...)")
        elif isinstance(node, ast.ClassDef):
            bases = {_name(b) for b in node.bases}
            if bases & _MODES:
                found.append(f"line {node.lineno}: class {node.name} subclasses a torch mode")
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    item.name in _INTERCEPTORS
                ):
                    found.append(f"line {item.lineno}: class {node.name} defines {item.name}")
        elif isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for t in ast.walk(target):
                    if isinstance(t, ast.Attribute) and t.attr == "forward":
                        found.append(f"line {node.lineno}: assigns .forward")
    return found


#: the hook layer itself
HOOK_LAYER = "capture/hooks.py"


def _outside_the_hook_layer() -> dict[str, list[str]]:
    result: dict[str, list[str]] = {}
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel == HOOK_LAYER:
            continue
        found = attachments(path.read_text(encoding="utf-8"))
        if found:
            result[rel] = found
    return result


def test_no_module_but_the_hook_layer_registers_a_hook_a_mode_or_a_forward() -> None:
    offenders = {
        rel: found
        for rel, found in _outside_the_hook_layer().items()
        if rel not in KNOWN_EXCEPTIONS
    }
    assert not offenders, (
        "attach through precguard.capture.hooks (on_calls, on_ops, on_param_grads, "
        "on_tensor_grad, on_node_grad, replace_forward, replace_function) instead: "
        f"{offenders}"
    )


def test_capture_itself_goes_through_the_hook_layer() -> None:
    # the monitor, op capture and the collectives are no exception
    inside = [rel for rel in _outside_the_hook_layer() if rel.startswith("capture/")]
    assert inside == []
    assert attachments((SRC / HOOK_LAYER).read_text(encoding="utf-8"))  # the layer is seen


def test_the_known_exceptions_are_still_needed() -> None:
    found = _outside_the_hook_layer()
    stale = [rel for rel in KNOWN_EXCEPTIONS if rel not in found]
    assert not stale, f"no longer attaching on their own, drop the exception: {stale}"


def test_every_way_of_attaching_is_found() -> None:
    source = """
import torch
from torch.overrides import TorchFunctionMode
from torch.nn.modules.module import register_module_forward_hook

class Watch(TorchFunctionMode):
    pass

class Sub(torch.Tensor):
    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

def attach(model, t, p):
    model.register_forward_pre_hook(lambda m, a: None)
    model.layer.register_forward_hook(lambda m, a, o: None, with_kwargs=False)
    t.register_hook(lambda g: None)
    p.register_post_accumulate_grad_hook(lambda p: None)
    register_module_forward_hook(lambda m, a, o: None)
    model.forward = lambda x: x
    setattr(model.layer, "forward", lambda x: x)
    t.grad_fn.register_hook(lambda gi, go: None)
    for name in ("all_reduce",):
        setattr(torch.distributed, name, lambda *a: None)
"""
    found = attachments(source)
    assert len(found) == 11, found
    kinds = {f.split(": ", 1)[1] for f in found}
    assert kinds == {
        "class Watch subclasses a torch mode",
        "class Sub defines __torch_function__",
        "calls register_forward_pre_hook",
        "calls register_forward_hook",
        "calls register_hook",
        "calls register_post_accumulate_grad_hook",
        "calls register_module_forward_hook",
        "assigns .forward",
        "setattr(..., 'forward', ...)",
        "setattr with a computed name",
    }


def test_reading_forward_or_calling_the_hook_layer_is_no_attachment() -> None:
    source = """
from precguard.capture.hooks import on_calls
def run(model, x):
    f = model.forward
    with on_calls(model, post=lambda name, m, a, k, o: None):
        return f(x)
"""
    assert attachments(source) == []
