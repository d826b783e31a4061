"""Diff two op graphs: fused or decomposed ops, dtype, shape and device changes per module.

Ops are compared module by module: within each module both sides' op
sequences are aligned on op names by a shortest edit script (Myers' diff,
:mod:`precguard.graph.align`: linear where the sides mostly agree, seconds for
thousands of ops a module). Aligned ops
are compared for the dtype they ran in (their first floating output), the
dtypes they read, their output shapes and devices; an unaligned stretch is a
**regrouping** — several ops on one side where the other ran fewer or other
ops in the same place (a fused RoPE or attention kernel: many-to-one; a
decomposed one: one-to-many) — or ops on one side only.

Differences are ranked by a likely-numeric-impact score, a heuristic stated
here so a user can weigh it: the mantissa bits a dtype change loses, tripled
for ops whose error grows with a reduction or an exponential (matmul, softmax,
norms, means, exp/log/rsqrt); a shape change 30 (a different computation); a
regrouping 3 per op that disappeared (each removed intermediate was a
rounding point); a device change 6; an op on one side only 4 (8 for a cast);
a dtype raised 0.1 per bit.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from precguard.graph.align import opcodes
from precguard.graph.model import OpGraph, OpNode

DIFF_SCHEMA_VERSION = 1

DiffKind = Literal[
    "dtype", "input_dtype", "shape", "device", "regrouped", "golden_only", "actual_only"
]

#: mantissa bits (explicit) of the float dtypes: what a cast loses
MANTISSA_BITS = {
    "float64": 52,
    "float32": 23,
    "float16": 10,
    "bfloat16": 7,
    "float8_e4m3fn": 3,
    "float8_e4m3fnuz": 3,
    "float8_e5m2": 2,
    "float8_e5m2fnuz": 2,
}

#: ops whose error grows with a reduction length or through an exponential
SENSITIVE = (
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "linear",
    "einsum",
    "softmax",
    "log_softmax",
    "_softmax",
    "_log_softmax",
    "scaled_dot_product_attention",
    "mean",
    "sum",
    "var",
    "std",
    "norm",
    "layer_norm",
    "rms_norm",
    "group_norm",
    "exp",
    "log",
    "rsqrt",
    "sqrt",
    "pow",
    "cumsum",
    "cross_entropy",
    "logsumexp",
    "sigmoid",
    "silu",
    "gelu",
    "tanh",
    "cos",
    "sin",
)
CASTS = ("to", "float", "half", "bfloat16", "double", "type", "type_as", "_to_copy")


class OpDifference(BaseModel):
    """One difference inside one module (repeated calls counted, not listed)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: DiffKind = Field(description="What differs.")
    module: str = Field(description="The module whose own ops differ.")
    golden_ops: list[str] = Field(description="The golden side's ops involved (in order).")
    actual_ops: list[str] = Field(description="The actual side's ops involved (in order).")
    golden: str | None = Field(default=None, description="Golden's value (dtype, shape, device).")
    actual: str | None = Field(default=None, description="Actual's value.")
    count: int = Field(default=1, description="How many calls in the module show it.")
    impact: float = Field(description="Likely numeric impact score (see precguard.graph.diff).")
    message: str = Field(description="The difference in words.")


class GraphDiff(BaseModel):
    """What ``precguard graph diff`` reports (``--json``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = Field(default=DIFF_SCHEMA_VERSION, description="Format version.")
    golden: str = Field(description="The golden graph or recording.")
    actual: str = Field(description="The actual graph or recording.")
    level: str = Field(description="'function' or 'aten': the level both graphs were taken at.")
    golden_ops: int = Field(description="Op calls on the golden side.")
    actual_ops: int = Field(description="Op calls on the actual side.")
    modules_compared: int = Field(description="Modules holding ops on either side.")
    verdict: Literal["same", "different"] = Field(description="'different' when any differs.")
    differences: list[OpDifference] = Field(description="Ranked, highest likely impact first.")


def _float_out(node: OpNode) -> str | None:
    return next((t.dtype for t in node.outputs if t.dtype in MANTISSA_BITS), None)


def _float_ins(node: OpNode) -> tuple[str, ...]:
    return tuple(sorted({t.dtype for t in node.inputs if t.dtype in MANTISSA_BITS}))


def _weight(op: str) -> float:
    return 3.0 if any(s in op for s in SENSITIVE) else 1.0


def _dtype_impact(op: str, golden: str, actual: str) -> float:
    lost = MANTISSA_BITS.get(golden, 23) - MANTISSA_BITS.get(actual, 23)
    return lost * _weight(op) if lost > 0 else -lost * 0.1


def _by_module(graph: OpGraph) -> dict[str, list[OpNode]]:
    out: dict[str, list[OpNode]] = {}
    for n in graph.nodes:
        out.setdefault(n.module, []).append(n)
    return out


def _names(nodes: Iterable[OpNode]) -> list[str]:
    return [n.op for n in nodes]


def _period(ops: list[str], k: int) -> list[str] | None:
    """The chunk ``ops`` repeats ``k`` times, or None."""
    if k < 2 or len(ops) % k:
        return None
    size = len(ops) // k
    chunk = ops[:size]
    return chunk if chunk * k == ops else None


def _fmt_ops(ops: list[str]) -> str:
    shown = ", ".join(ops[:12]) + (f", ... ({len(ops)} ops)" if len(ops) > 12 else "")
    return shown if len(ops) > 12 or len(ops) == 1 else f"{shown} ({len(ops)} ops)"


def _regrouped(module: str, g: list[str], a: list[str]) -> OpDifference:
    removed = max(len(g) - len(a), len(a) - len(g), 1)
    g_chunk, a_chunk = _period(g, len(a)), _period(a, len(g))
    if len(a) > 1 and len(set(a)) == 1 and g_chunk is not None:
        msg = f"each {_fmt_ops(g_chunk)} on golden ran as one {a[0]} on actual (x{len(a)}): fused"
    elif len(g) > 1 and len(set(g)) == 1 and a_chunk is not None:
        msg = f"each {g[0]} on golden ran as {_fmt_ops(a_chunk)} on actual (x{len(g)}): decomposed"
    else:
        how = "fused" if len(g) > len(a) else "decomposed" if len(g) < len(a) else "replaced"
        msg = f"{_fmt_ops(g)} on golden ran as {_fmt_ops(a)} on actual: {how}"
    return OpDifference(
        kind="regrouped",
        module=module,
        golden_ops=g,
        actual_ops=a,
        impact=3.0 * removed,
        message=msg,
    )


def _one_side(module: str, ops: list[str], side: str) -> OpDifference:
    cast = all(op in CASTS for op in ops)
    other = "actual" if side == "golden" else "golden"
    return OpDifference(
        kind="golden_only" if side == "golden" else "actual_only",
        module=module,
        golden_ops=ops if side == "golden" else [],
        actual_ops=ops if side == "actual" else [],
        impact=(8.0 if cast else 4.0) * len(ops),
        message=f"{_fmt_ops(ops)} ran on {side} only (not on {other})"
        + ("; an extra cast" if cast else ""),
    )


def _pair(module: str, g: OpNode, a: OpNode) -> list[OpDifference]:
    found = []

    def differs(kind: DiffKind, golden: str, actual: str, impact: float, message: str) -> None:
        found.append(
            OpDifference(
                kind=kind,
                module=module,
                golden_ops=[g.op],
                actual_ops=[a.op],
                golden=golden,
                actual=actual,
                impact=impact,
                message=message,
            )
        )

    go, ao = _float_out(g), _float_out(a)
    gi, ai = _float_ins(g), _float_ins(a)
    if go and ao and go != ao:
        differs(
            "dtype",
            go,
            ao,
            _dtype_impact(g.op, go, ao),
            f"{g.op} ran in {ao} on actual, {go} on golden",
        )
    elif gi != ai and gi and ai:
        impact = max(_dtype_impact(g.op, x, y) for x in gi for y in ai)
        gs, as_ = "/".join(gi), "/".join(ai)
        differs("input_dtype", gs, as_, impact, f"{g.op} read {as_} on actual, {gs} on golden")
    gs, as_ = [t.shape for t in g.outputs], [t.shape for t in a.outputs]
    if gs != as_:
        differs(
            "shape",
            str(gs),
            str(as_),
            30.0,
            f"{g.op} output shape {as_} on actual, {gs} on golden",
        )
    gd = next((t.device for t in g.outputs if t.device), None)
    ad = next((t.device for t in a.outputs if t.device), None)
    if gd != ad:
        differs(
            "device",
            gd or "the run's device",
            ad or "the run's device",
            6.0,
            f"{g.op} ran on {ad or 'the run device'} on actual, {gd or 'the run device'} on golden",
        )
    return found


def _merge(found: list[OpDifference]) -> list[OpDifference]:
    """Count repeats of the same difference within a module instead of listing each."""
    merged: dict[tuple[object, ...], OpDifference] = {}
    for d in found:
        key = (d.kind, d.module, tuple(d.golden_ops), tuple(d.actual_ops), d.golden, d.actual)
        seen = merged.get(key)
        if seen is None:
            merged[key] = d
        else:
            merged[key] = seen.model_copy(update={"count": seen.count + d.count})
    return list(merged.values())


def diff_graphs(
    golden: OpGraph, actual: OpGraph, *, golden_name: str = "golden", actual_name: str = "actual"
) -> GraphDiff:
    """Compare two op graphs of the same model, module by module (see the module doc).

    Raises ValueError when they were taken at different levels (function vs aten):
    their op names do not correspond.
    """
    if golden.level != actual.level:
        raise ValueError(
            f"the graphs are at different levels: {golden_name} at {golden.level}, "
            f"{actual_name} at {actual.level}; take both at the same level"
        )
    gm, am = _by_module(golden), _by_module(actual)
    modules = list(dict.fromkeys([*gm, *am]))
    found: list[OpDifference] = []
    for module in modules:
        g, a = gm.get(module, []), am.get(module, [])
        for tag, i1, i2, j1, j2 in opcodes(_names(g), _names(a)):
            if tag == "equal":
                for gn, an in zip(g[i1:i2], a[j1:j2], strict=True):
                    found.extend(_pair(module, gn, an))
            elif tag == "replace":
                found.append(_regrouped(module, _names(g[i1:i2]), _names(a[j1:j2])))
            elif tag == "delete":
                found.append(_one_side(module, _names(g[i1:i2]), "golden"))
            else:
                found.append(_one_side(module, _names(a[j1:j2]), "actual"))
    merged = _merge(found)
    order = {m: i for i, m in enumerate(modules)}
    merged.sort(key=lambda d: (-d.impact * d.count**0.5, order[d.module]))
    return GraphDiff(
        golden=golden_name,
        actual=actual_name,
        level=golden.level,
        golden_ops=len(golden.nodes),
        actual_ops=len(actual.nodes),
        modules_compared=len(modules),
        verdict="different" if merged else "same",
        differences=merged,
    )
