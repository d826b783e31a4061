"""Record the collectives a monitored run calls: ``dist.<op>`` records with the process group.

While a recording is open (``monitor(..., out=...)`` or ``record(...)``), the
public collective functions of ``torch.distributed`` (the c10d API) and of
``torch.distributed._functional_collectives`` are replaced by wrappers that
record the statistics of the op's input tensors before the call and of its
output tensors after it, then hand back exactly what the original returned.
The originals come back when the last recording closes (in a ``finally``), so
nothing stays patched after a run, even one that raised.

Why wrappers, not a ``TorchFunctionMode``/``TorchDispatchMode``: a mode sees
*every* op the model runs and costs a Python call per op for the whole
monitored region, while collectives are a handful of calls per layer. Wrapping
the few public functions costs nothing anywhere else. What the wrappers do not
see (written down in docs/distributed.md): a collective the code looked up
before the recording opened (``from torch.distributed import all_reduce``),
collectives issued from C++ (DDP's gradient buckets, FSDP's internals), and
collectives inside a ``torch.compile``'d graph.

What is recorded, per call: ``dist.<op>.<call>.<phase>.input.<i>`` for each
input tensor and ``...output.<i>`` for each output tensor; ``call`` counts
calls of that op within the step; the phase is ``backward`` when the
collective runs inside the autograd engine (a gradient hook). Each record
carries ``collective`` = op, API, group ranks, reduce op and whether it was
asynchronous. For ``async_op=True`` the inputs are recorded at the call and the
outputs when the returned work's ``wait()`` returns (a work that is never
waited on records no output). A functional collective's output is recorded at
return, which waits for it (its result is the same; only its overlap with
later compute is lost while recording).

Statistics are taken of a fresh detached view of each tensor, so an in-place
op (``all_reduce``, ``broadcast``) is never served the statistics cached for
its input.
"""

from __future__ import annotations

import functools
import inspect
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from precguard._logging import get_logger
from precguard.capture.active import active_recording
from precguard.capture.hooks import HookHandle, replace_function

logger = get_logger(__name__)

#: c10d function -> (names of input tensor arguments, names of output tensor arguments);
#: an in-place op names the same argument on both sides
C10D_OPS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "all_reduce": (("tensor",), ("tensor",)),
    "broadcast": (("tensor",), ("tensor",)),
    "reduce_scatter": (("input_list",), ("output",)),
    "reduce_scatter_tensor": (("input",), ("output",)),
    "all_gather": (("tensor",), ("tensor_list",)),
    "all_gather_into_tensor": (("input_tensor",), ("output_tensor",)),
    # torch >= 2.13 names of the two above (the old names call these)
    "all_gather_single": (("input_tensor",), ("output_tensor",)),
    "reduce_scatter_single": (("input",), ("output",)),
    "all_to_all": (("input_tensor_list",), ("output_tensor_list",)),
    "all_to_all_single": (("input",), ("output",)),
}

#: collectives of Python objects: they pickle the object into a byte tensor and call the
#: tensor collectives above, which record nothing while one of these runs (the bytes of
#: a pickled object are not the model's numbers)
OBJECT_OPS: tuple[str, ...] = (
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)

#: functional collectives: the input is ``self``, the output is the return value
FUNCTIONAL_OPS: tuple[str, ...] = (
    "all_reduce",
    "broadcast",
    "reduce_scatter_tensor",
    "all_gather_tensor",
    "all_to_all_single",
)

#: per op, the object its calls are counted under in a recording's step
_COUNTERS: dict[str, object] = {}

_LOCK = threading.Lock()
_DEPTH = 0
#: every replaced function while patched, removed together
_PATCHED = HookHandle()


_QUIET = threading.local()


def _sink() -> Any:
    if getattr(_QUIET, "depth", 0):
        return None
    rec = active_recording()
    if rec is None or rec.closed or not rec.options.collectives:
        return None
    return rec


def _tensors(value: Any, name: str) -> list[tuple[str, torch.Tensor]]:
    """``(name, detached view)`` for a tensor or a list of tensors (fresh objects, see the doc)."""
    if isinstance(value, torch.Tensor):
        return [(name, value.detach())]
    if isinstance(value, (list, tuple)):
        return [
            (f"{name}.{i}", v.detach()) for i, v in enumerate(value) if isinstance(v, torch.Tensor)
        ]
    return []


def group_ranks(group: Any) -> list[int] | None:
    """The global ranks of a c10d or functional collective's ``group`` argument, if known."""
    dist = torch.distributed
    try:
        if group is None:
            return list(range(dist.get_world_size()))
        if isinstance(group, dist.ProcessGroup):
            return list(dist.get_process_group_ranks(group))
        if isinstance(group, (list, tuple)) and all(isinstance(r, int) for r in group):
            return list(group)
        mesh_type = getattr(getattr(dist, "device_mesh", None), "DeviceMesh", None)
        if mesh_type is not None and isinstance(group, mesh_type) and group.ndim == 1:
            return list(dist.get_process_group_ranks(group.get_group()))
        if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], mesh_type):
            return list(dist.get_process_group_ranks(group[0].get_group(group[1])))
    except Exception:  # an exotic group: the record still has its statistics
        return None
    return None


def _phase() -> str:
    try:
        return "backward" if torch._C._current_graph_task_id() != -1 else "forward"
    except AttributeError:  # an older torch without the query
        return "forward"


def _reduce_op_name(op: Any) -> str | None:
    if op is None:
        return None
    if isinstance(op, str):
        return op.lower()
    name = getattr(op, "name", None) or str(op)
    return str(name).rsplit(".", 1)[-1].lower()


class _Call:
    """One collective call being recorded: where its records go and what they say."""

    __slots__ = ("call", "info", "module", "phase", "sink")

    def __init__(self, sink: Any, op: str, info: dict[str, Any]) -> None:
        self.sink = sink
        self.module = f"dist.{op}"
        # one count per op, whichever API called it, so keys never repeat in a step
        self.call = sink.begin_call(_COUNTERS.setdefault(op, object()), root=False)
        self.phase = _phase()
        self.info = info

    def add(self, role: str, items: list[tuple[str, torch.Tensor]]) -> None:
        if items and not self.sink.closed:
            self.sink.add(
                self.module,
                self.info["op"],
                self.call,
                self.phase,
                role,
                items,
                extra={"collective": self.info},
            )


class RecordedWork:
    """The work of an ``async_op=True`` collective: records its output when waited on.

    Everything but ``wait`` is the original work's (``is_completed``,
    ``get_future``, ...).
    """

    def __init__(self, work: Any, on_done: Callable[[], None]) -> None:
        self._work = work
        self._on_done: Callable[[], None] | None = on_done

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        """Wait for the collective (as the original work does), then record its output once."""
        result = self._work.wait(*args, **kwargs)
        done, self._on_done = self._on_done, None
        if done is not None:
            done()
        return result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._work, name)


def _wrap_c10d(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)
    in_names, out_names = C10D_OPS[op]

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sink = _sink() if _DEPTH else None
        if sink is None:
            return original(*args, **kwargs)
        try:
            bound = signature.bind(*args, **kwargs)
            arguments = {**_defaults(signature), **bound.arguments}
            async_op = bool(arguments.get("async_op", False))
            info = {
                "op": op,
                "api": "c10d",
                "group": group_ranks(arguments.get("group")),
                "reduce_op": _reduce_op_name(arguments.get("op")),
                "async": async_op,
            }
            rec = _Call(sink, op, info)
            rec.add("input", [x for n in in_names for x in _tensors(arguments.get(n), n)])
        except Exception as exc:
            _report(op, exc)
            return original(*args, **kwargs)
        result = _quietly(original, args, kwargs)

        def record_outputs() -> None:
            try:
                rec.add("output", [x for n in out_names for x in _tensors(arguments.get(n), n)])
            except Exception as exc:
                _report(op, exc)

        if async_op and result is not None:
            return RecordedWork(result, record_outputs)
        record_outputs()
        return result

    wrapper.__precguard_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _wrap_functional(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    signature = inspect.signature(original)

    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        sink = _sink() if _DEPTH else None
        if sink is None:
            return original(*args, **kwargs)
        try:
            arguments = {**_defaults(signature), **signature.bind(*args, **kwargs).arguments}
            info = {
                "op": op,
                "api": "functional",
                "group": group_ranks(arguments.get("group")),
                "reduce_op": _reduce_op_name(arguments.get("reduceOp")),
                "async": False,
            }
            rec = _Call(sink, op, info)
            rec.add("input", _tensors(arguments.get("self"), "self"))
        except Exception as exc:
            _report(op, exc)
            return original(*args, **kwargs)
        result = _quietly(original, args, kwargs)
        try:
            rec.add("output", _tensors(result, "output"))
        except Exception as exc:
            _report(op, exc)
        return result

    wrapper.__precguard_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _quietly(original: Callable[..., Any], args: Any, kwargs: Any) -> Any:
    """Call ``original`` with recording off: a collective that calls another (the old
    ``all_gather_into_tensor`` calls ``all_gather_single``) is recorded once, as called."""
    _QUIET.depth = getattr(_QUIET, "depth", 0) + 1
    try:
        return original(*args, **kwargs)
    finally:
        _QUIET.depth -= 1


def _wrap_object_op(op: str, original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        return _quietly(original, args, kwargs)

    wrapper.__precguard_original__ = original  # type: ignore[attr-defined]
    return wrapper


def _defaults(signature: inspect.Signature) -> dict[str, Any]:
    return {
        n: p.default for n, p in signature.parameters.items() if p.default is not inspect._empty
    }


_REPORTED: set[str] = set()


def _report(op: str, exc: BaseException) -> None:
    if op in _REPORTED:
        return
    _REPORTED.add(op)
    logger.error("hook_failed", module=f"dist.{op}", error=f"{type(exc).__name__}: {exc}")


def _targets() -> Iterator[tuple[Any, str, Callable[[str, Callable[..., Any]], Any], str]]:
    """(module, attribute, wrapper factory, op) for every function to patch."""
    if not torch.distributed.is_available():
        return
    from torch.distributed import distributed_c10d

    for op in C10D_OPS:
        for module in (torch.distributed, distributed_c10d):
            if hasattr(module, op):
                yield module, op, _wrap_c10d, op
    for op in OBJECT_OPS:
        for module in (torch.distributed, distributed_c10d):
            if hasattr(module, op):
                yield module, op, _wrap_object_op, op
    try:
        from torch.distributed import _functional_collectives as funcol
    except ImportError:  # a torch without functional collectives
        return
    for op in FUNCTIONAL_OPS:
        if hasattr(funcol, op):
            yield funcol, op, _wrap_functional, op


def install() -> None:
    """Patch the collectives (the first open recording does; nested ones count)."""
    global _DEPTH, _PATCHED
    with _LOCK:
        _DEPTH += 1
        if _DEPTH > 1:
            return
        _PATCHED = HookHandle()
        wrapped: dict[int, Callable[..., Any]] = {}  # one wrapper per original function
        for module, name, factory, op in _targets():
            original = getattr(module, name)
            if getattr(original, "__precguard_original__", None) is not None:
                continue  # already ours (a stale patch is never stacked)
            wrapper = wrapped.get(id(original))
            if wrapper is None:
                wrapper = wrapped[id(original)] = factory(op, original)
            # someone wrapped our wrapper by the time it is removed: it passes through
            # then (_DEPTH is 0), and stays
            shadowed = functools.partial(logger.warning, "collective_patch_shadowed", function=name)
            _PATCHED._add(replace_function(module, name, wrapper, shadowed=shadowed))


def uninstall() -> None:
    """Put the original functions back when the last recording closes."""
    global _DEPTH
    with _LOCK:
        if _DEPTH == 0:
            return
        _DEPTH -= 1
        if _DEPTH > 0:
            return
        _PATCHED.remove()


@contextmanager
def recording_collectives() -> Iterator[None]:
    """Patch the collectives for the duration of the block, restored in ``finally``."""
    install()
    try:
        yield
    finally:
        uninstall()


def is_patched() -> bool:
    """True while any collective function is replaced by precguard's wrapper."""
    return any(
        getattr(getattr(module, name), "__precguard_original__", None) is not None
        for module, name, _f, _op in _targets()
    )
