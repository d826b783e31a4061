"""Build an :class:`OpGraph`: from ``torch.export``, an op-level trace, or a recording.

``torch.export`` gives the whole program at aten level, also the branches a
forward did not take, but refuses models with data-dependent control flow or
objects it cannot trace (many KV caches). The op trace runs one forward under
:class:`~precguard.capture.ops.OpCapture` and keeps only metadata (op, dtypes,
shapes, devices, module): it works for every model that runs, at either level.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from precguard._logging import get_logger
from precguard.capture.options import CaptureOptions
from precguard.errors import DumpFormatError, UsageError
from precguard.graph.model import GRAPH_SCHEMA_VERSION, Level, OpGraph, OpNode, TensorMeta
from precguard.text import shown

logger = get_logger(__name__)

Prefer = Literal["auto", "export", "trace"]


def _meta(t: torch.Tensor, device: str | None) -> TensorMeta:
    kind = t.device.type
    return TensorMeta(
        dtype=str(t.dtype).removeprefix("torch."),
        shape=list(t.shape),
        device=kind if kind != device else None,
    )


class _Frame:
    __slots__ = ("call", "module", "module_type", "node", "save")

    def __init__(self, module: str, module_type: str, call: int, node: dict[str, Any]) -> None:
        self.module = module
        self.module_type = module_type
        self.call = call
        self.node = node
        self.save = False


class _GraphSink:
    """What :class:`OpCapture` writes into when only the graph is wanted: no statistics."""

    def __init__(self, device: str) -> None:
        self.closed = False
        self.device = device
        self.nodes: list[dict[str, Any]] = []
        self._calls: dict[int, int] = {}

    def begin_call(self, obj: object, *, root: bool) -> int:
        return 0

    def flush(self) -> None:
        return None

    def enter(
        self,
        obj: object,
        module: str,
        module_type: str,
        inputs: list[tuple[str, torch.Tensor]],
        **_: Any,
    ) -> _Frame:
        call = self._calls.get(id(obj), 0)
        self._calls[id(obj)] = call + 1
        owner, _, op = module.rpartition(".op.")
        node = {
            "id": len(self.nodes),
            "op": op,
            "target": module_type,
            "module": owner,
            "call": call,
            "inputs": [_meta(t, self.device) for _, t in inputs],
            "outputs": [],
        }
        self.nodes.append(node)
        return _Frame(module, module_type, call, node)

    def leave(
        self, frame: _Frame, outputs: list[tuple[str, torch.Tensor]], *, extra: Any = None
    ) -> None:
        # ``extra`` (an output's device when it differs from the model's) is in each
        # output's TensorMeta already
        frame.node["outputs"] = [_meta(t, self.device) for _, t in outputs]


def _model_facts(model: nn.Module) -> tuple[str, str | None]:
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    device = first.device.type if first is not None else "cpu"
    dtype = None
    for p in model.parameters():
        if p.is_floating_point():
            dtype = str(p.dtype).removeprefix("torch.")
            break
    return device, dtype


def trace_graph(
    model: nn.Module,
    run: Callable[[], Any],
    *,
    level: Level = "function",
    device: str | None = None,
    ops: list[str] | None = None,
) -> OpGraph:
    """The op graph of one forward: ``run()`` must call ``model`` (once or more).

    >>> graph = trace_graph(model, lambda: model(ids))          # doctest: +SKIP
    >>> [n.op for n in graph.nodes if n.module.endswith("self_attn")][:3]  # doctest: +SKIP
    ['linear', 'linear', 'linear']
    """
    from precguard.capture.ops import OpCapture

    kind, dtype = _model_facts(model)
    sink = _GraphSink(kind)
    options = CaptureOptions(level="op", ops_at=level, ops=ops)
    capture = OpCapture(model, sink, options)  # type: ignore[arg-type]
    try:
        with torch.no_grad():
            run()
    finally:
        capture.remove()
    return OpGraph(
        source="op-trace",
        level=level,
        device=device or kind,
        dtype=dtype,
        model=type(model).__name__,
        nodes=[OpNode(**n) for n in sink.nodes],
    )


def _fx_meta(value: Any, device: str) -> list[TensorMeta]:
    vals = value if isinstance(value, (tuple, list)) else [value]
    return [_meta(v, device) for v in vals if isinstance(v, torch.Tensor)]


def _arg_nodes(node: Any) -> list[Any]:
    """The fx nodes among ``node``'s arguments, also inside lists (``cat``'s tensors)."""
    found: list[Any] = []
    for a in itertools.chain(node.args, node.kwargs.values()):
        for item in a if isinstance(a, (list, tuple)) else (a,):
            if isinstance(item, torch.fx.Node):
                found.append(item)
    return found


def _owner(node: Any) -> str:
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "root"
    path = list(stack.values())[-1][0]
    path = str(path).replace("L['self'].", "").replace("L['self']", "")
    for ch in "[]":
        path = path.replace(ch, "." if ch == "[" else "")
    return path.strip(".") or "root"


def exported_graph(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    device: str | None = None,
) -> OpGraph:
    """The aten op graph of ``torch.export.export(model, args, kwargs)``.

    Raises whatever ``torch.export`` raises for a model it cannot export.
    """
    from precguard.capture.ops import LAYOUT_OPS, aten_op_name

    kind, dtype = _model_facts(model)
    program = torch.export.export(model, args, kwargs or {}, strict=False)
    # core aten, as the dispatcher runs it (linear as addmm, softmax as _softmax), so an
    # export and a dispatch-level trace can be diffed; activations the CPU and GPUs run
    # as one kernel stay one op
    table = torch.export.default_decompositions()
    for op in (torch.ops.aten.silu.default, torch.ops.aten.gelu.default):
        table.pop(op, None)
    program = program.run_decompositions(table)
    nodes: list[OpNode] = []
    counts: dict[tuple[str, str], int] = {}
    for node in program.graph_module.graph.nodes:
        if node.op != "call_function" or not isinstance(node.target, torch._ops.OpOverload):
            continue
        name, qualified = aten_op_name(node.target)
        if name in LAYOUT_OPS or node.target.is_view:
            continue
        outputs = _fx_meta(node.meta.get("val"), kind)
        if not outputs:
            continue
        module = _owner(node)
        call = counts.get((module, name), 0)
        counts[(module, name)] = call + 1
        inputs = [
            m
            for a in _arg_nodes(node)
            if a.op != "get_attr"
            and not (a.op == "placeholder" and a.name.startswith(("p_", "b_")))
            for m in _fx_meta(a.meta.get("val"), kind)
        ]
        nodes.append(
            OpNode(
                id=len(nodes),
                op=name,
                target=qualified,
                module=module,
                call=call,
                inputs=inputs,
                outputs=outputs,
            )
        )
    return OpGraph(
        source="torch.export",
        level="aten",
        device=device or kind,
        dtype=dtype,
        model=type(model).__name__,
        nodes=nodes,
    )


def model_graph(
    model: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any] | None = None,
    *,
    prefer: Prefer = "auto",
    level: Level = "aten",
    device: str | None = None,
    numerics: Callable[[], Any] | None = None,
) -> OpGraph:
    """The model's op graph: ``torch.export`` where it works (``auto``/``export``), else a trace.

    ``level="function"`` always traces (``torch.export`` sees aten ops only).
    ``numerics``: a context manager factory the forward runs under (a backend's
    ``numerics()``, ``torch.autocast``); a trace records the dtypes it produces.
    """
    import contextlib

    kwargs = kwargs or {}
    if getattr(getattr(model, "config", None), "use_cache", False) and "use_cache" not in kwargs:
        # a transformers model returns its KV cache, an object torch.export cannot trace;
        # the cache is no part of one forward's arithmetic (and both sources leave it out)
        kwargs = {**kwargs, "use_cache": False}
    ctx = numerics or contextlib.nullcontext
    if prefer != "trace" and level == "aten":
        try:
            with ctx():
                return exported_graph(model, args, kwargs, device=device)
        except Exception as exc:
            if prefer == "export":
                raise UsageError(
                    f"torch.export could not export {type(model).__name__}: "
                    f"{type(exc).__name__}: {shown(exc, 200)}; use --source trace"
                ) from exc
            logger.info("export_failed_tracing", model=type(model).__name__, error=str(exc)[:200])

    def run() -> Any:
        with ctx():
            return model(*args, **kwargs)

    return trace_graph(model, run, level=level, device=device)


def graph_from_run(path: str | os.PathLike[str], *, rank: int = 0, step: int = 0) -> OpGraph:
    """The op graph of step ``step`` of a level='op' (or 'both') recording.

    Raises :class:`~precguard.errors.DumpFormatError` when it holds no op records.
    """
    from precguard.dump.reader import Run

    run = Run(path)
    by_call: dict[tuple[str, int], dict[str, Any]] = {}
    for rec in run.records(rank):
        if rec.step != step or rec.phase != "forward" or ".op." not in rec.module:
            continue
        owner, _, op = rec.module.rpartition(".op.")
        node = by_call.get((rec.module, rec.call))
        if node is None:
            node = by_call[(rec.module, rec.call)] = {
                "seq": rec.seq,
                "op": op,
                "target": rec.module_type,
                "module": owner,
                "call": rec.call,
                "inputs": [],
                "outputs": [],
            }
        meta = TensorMeta(dtype=rec.dtype, shape=rec.shape, device=rec.device)
        if rec.role == "input":
            node["inputs"].append(meta)
        elif rec.role == "output":
            node["outputs"].append(meta)
            node["seq"] = min(node["seq"], rec.seq)
    if not by_call:
        raise DumpFormatError(
            f"{shown(path)}: no op-level records at rank {rank}, step {step}; record with "
            "monitor(..., level='op') or level='both'"
        )
    manifest = run.manifest
    ordered = sorted(by_call.values(), key=lambda n: n["seq"])
    level = "aten" if all(n["target"].startswith("aten.") for n in ordered) else "function"
    return OpGraph(
        source="recording",
        level=level,
        device=manifest.device,
        dtype=manifest.dtype,
        model=manifest.model,
        nodes=[
            OpNode(id=i, **{k: v for k, v in n.items() if k != "seq"})
            for i, n in enumerate(ordered)
        ],
    )


#: a graph file holds one line of JSON per op, ~300 bytes: a million ops is 300 MB
MAX_GRAPH_BYTES = 512 * 1024 * 1024


def load_graph(path: str | os.PathLike[str]) -> OpGraph:
    """A graph file written by ``graph export``, or the op graph of a recording directory."""
    p = Path(path)
    if p.is_dir():
        return graph_from_run(p)
    if not p.exists():
        raise UsageError(f"{shown(p)}: no such graph file or recording directory")
    from precguard.dump.untrusted import read_json_file, validated

    # a regular file, its size and nesting bounded, every field validated strictly
    raw = read_json_file(p, limit=MAX_GRAPH_BYTES, what="precguard graph file")
    graph = validated(OpGraph, raw, where=f"{shown(p)} (not a precguard graph file)")
    if graph.schema_version > GRAPH_SCHEMA_VERSION:
        raise DumpFormatError(
            f"{shown(p)}: graph schema_version {graph.schema_version} is newer than this "
            f"precguard reads ({GRAPH_SCHEMA_VERSION}); upgrade precguard"
        )
    return graph
