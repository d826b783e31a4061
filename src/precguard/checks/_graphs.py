"""Which ops ran below the reference's precision: op graphs of one forward, device vs reference.

Both sides run batch 0 under op capture (:func:`precguard.graph.build.trace_graph`,
function level) and :func:`precguard.graph.diff.diff_graphs` pairs their ops
module by module. An op "ran below the reference" when the dtype it produced
(or read) carries fewer mantissa bits on the device. Dtypes are what the
graph shows: an ``emu:`` profile that rounds values while keeping fp32 tensors
shows up in ``ops.op_precision`` (measured against fp64), not here.

The reference's graph is the same for every check that asks (``amp.autocast_ops``
under autocast, ``ops.graph_dtypes`` without): it is traced once per checklist
run and kept in the lab's cache, as the device's plain graph is.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import Any

from torch import nn

from precguard.checks._lab import Lab
from precguard.graph.build import trace_graph
from precguard.graph.diff import MANTISSA_BITS, diff_graphs


def ops_below_reference(
    bench: Lab,
    sensitive: Collection[str],
    device_context: Callable[[], Any] | None = None,
    watch: Callable[[nn.Module], Any] | None = None,
) -> list[dict[str, Any]]:
    """Ops of the device's forward that ran below the reference's precision, worst first.

    ``device_context``: a context manager factory entered inside the device's
    numerics (``torch.autocast``). Each entry: module, op, reference and device
    dtype, calls, and whether the op is one of ``sensitive`` (the amp checks'
    reductions and exponentials, what autocast keeps in fp32) and *ran* lower.
    ``watch(model)``: a context (an op watcher) entered inside ``device_context``
    around the device's traced forward, so a check that watches that forward
    shares it instead of running one of its own.
    """
    golden = _traced(bench, "reference", None)
    actual = _traced(bench, "device", device_context, watch)
    found = []
    for d in diff_graphs(golden, actual).differences:
        if d.kind not in ("dtype", "input_dtype") or d.golden is None or d.actual is None:
            continue
        ref = min(MANTISSA_BITS.get(x, 23) for x in d.golden.split("/"))
        dev = min(MANTISSA_BITS.get(x, 23) for x in d.actual.split("/"))
        if dev >= ref:
            continue
        op = d.golden_ops[0]
        found.append(
            {
                "module": d.module,
                "op": op,
                "reference_dtype": d.golden,
                "device_dtype": d.actual,
                "what": "ran in" if d.kind == "dtype" else "read",
                "calls": d.count,
                "sensitive": op in sensitive and d.kind == "dtype",
            }
        )
    found.sort(key=lambda e: not e["sensitive"])  # stable: then by the diff's likely impact
    return found


def _traced(
    bench: Lab,
    on: Any,
    context: Callable[[], Any] | None,
    watch: Callable[[nn.Module], Any] | None = None,
) -> Any:
    """The op graph of one forward of batch 0 on ``on``; cached unless in a ``context``
    or under a ``watch`` (whose callbacks must see the forward)."""
    key = f"op_graph:{on}"
    shared = context is None and watch is None
    if shared:
        bench.output(on)  # the side's shared forward is traced (Lab.output)
        if key in bench._cache:
            return bench._cache[key]
    model = bench.copy(on)

    def inner() -> contextlib.ExitStack:
        stack = contextlib.ExitStack()
        if context is not None:
            stack.enter_context(context())
        if watch is not None:
            stack.enter_context(watch(model))
        return stack

    graph = trace_graph(model, lambda: bench.forward(model, on, inner=inner()))
    if shared:
        bench._cache[key] = graph
    return graph
