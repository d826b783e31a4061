"""Which ops ran below the reference's precision: op graphs of one forward, device vs reference.

Both sides run batch 0 under op capture (:func:`precguard.graph.build.trace_graph`,
function level) and :func:`precguard.graph.diff.diff_graphs` pairs their ops
module by module. An op "ran below the reference" when the dtype it produced
(or read) carries fewer mantissa bits on the device. Dtypes are what the
graph shows: an ``emu:`` profile that rounds values while keeping fp32 tensors
shows up in ``ops.op_precision`` (measured against fp64), not here.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Collection
from typing import Any

from precguard.checks._lab import Lab
from precguard.graph.build import trace_graph
from precguard.graph.diff import MANTISSA_BITS, diff_graphs


def ops_below_reference(
    bench: Lab, sensitive: Collection[str], device_context: Callable[[], Any] | None = None
) -> list[dict[str, Any]]:
    """Ops of the device's forward that ran below the reference's precision, worst first.

    ``device_context``: a context manager factory entered inside the device's
    numerics (``torch.autocast``). Each entry: module, op, reference and device
    dtype, calls, and whether the op is one of ``sensitive`` (the amp checks'
    reductions and exponentials, what autocast keeps in fp32) and *ran* lower.
    """
    ref_model, dev_model = bench.copy("reference"), bench.copy("device")
    inner = device_context or contextlib.nullcontext
    golden = trace_graph(ref_model, lambda: bench.forward(ref_model, "reference"))
    actual = trace_graph(dev_model, lambda: bench.forward(dev_model, "device", inner=inner()))
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
