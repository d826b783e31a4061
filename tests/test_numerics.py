"""The numerics core: one definition each of the floor, K, the measure, the ladder, the thresholds.

Every tool that decides "is this error what a correct computation explains?" (compare's
judge and divergence, replay, bisect, op-check, the optimizer and routing rules, impact,
generate-diff) asks :mod:`precguard.numerics`. The unit tests pin its values (bf16's floor,
a measure with NaN/Inf, the ladder); the scans hold that no second definition grows back.
"""

from __future__ import annotations

import ast
import math
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

import precguard
from precguard import numerics
from precguard.numerics import (
    ladder,
    measure,
    reduction_length,
    relative_l2,
    rounding_floor,
    status,
    unit_roundoff,
)

SRC = Path(precguard.__file__).resolve().parent
CORE = SRC / "numerics.py"

# -- the rounding floor ---------------------------------------------------------------------


def test_bf16_floor_is_one_rounding_plus_the_fp32_accumulation_of_its_reduction() -> None:
    u = 2.0**-8
    assert unit_roundoff("bfloat16") == u
    assert rounding_floor("bfloat16") == u
    # accelerators accumulate in fp32: sqrt(K) fp32 roundoffs, Higham & Mary's bound
    assert rounding_floor("bfloat16", 4096) == pytest.approx(u + 64 * 2.0**-24)
    assert rounding_floor("float16", 1) == 2.0**-11  # no reduction
    # a precision finer than fp32 accumulates in itself
    assert rounding_floor("float64", 100) == pytest.approx(2.0**-53 + 10 * 2.0**-53)
    # non-float dtypes are judged as fp32
    assert unit_roundoff("int64") == 2.0**-24


def test_op_check_allows_sixteen_roundings_plus_the_accumulation() -> None:
    assert numerics.opcheck_tolerance("bfloat16", 4096) == pytest.approx(
        numerics.TOLERANCE_EPS * torch.finfo(torch.bfloat16).eps + 64 * 2.0**-24
    )


def test_the_thresholds_are_multiples_with_their_arithmetic() -> None:
    assert numerics.REPLAY_MARGIN == numerics.PRODUCT_GROWTH + 2 == 4
    assert numerics.MIN_LOCAL_GROWTH == numerics.PRODUCT_GROWTH == 2
    assert numerics.TOLERANCE_EPS * 2 == numerics.OPCHECK_ROUNDINGS == 16
    assert numerics.MEAN_TO_SPREAD == numerics.TOLERANCE_EPS
    assert pytest.approx(1 / numerics.AMPLIFICATION) == numerics.HELP_SHARE
    # the one-pass variance at MEAN_TO_SPREAD exceeds the tolerance; centring stays within
    m, tol = numerics.MEAN_TO_SPREAD, numerics.OPCHECK_ROUNDINGS
    assert m < tol < m * m


# -- the reduction length -------------------------------------------------------------------


def test_reduction_length_is_the_last_dimension_and_in_backward_the_rows_too() -> None:
    assert reduction_length([(2, 5, 64), (128, 64)]) == 64
    assert reduction_length([(4, 100, 64)], backward=True) == 400
    assert reduction_length([(), None, (3, 0)]) is None
    assert reduction_length(widths=[64, 172]) == 172
    assert reduction_length() is None


# -- the measure ----------------------------------------------------------------------------


def test_measure_of_a_scaled_tensor_reads_its_scale_and_relative_errors() -> None:
    g = torch.linspace(-1, 1, 101, dtype=torch.float64)
    m = measure(1.01 * g, g, torch.float32)
    assert m.rel_l2 == pytest.approx(0.01)
    assert m.max_rel == pytest.approx(0.01)
    assert m.scale == pytest.approx(1.01)
    assert m.max_abs == pytest.approx(0.01)
    assert m.ulps is not None and m.ulps > 1000  # 1 % is far beyond fp32's spacing
    assert m.finite and m.nonfinite_mismatch == 0


def test_a_nan_or_inf_on_one_side_is_never_a_zero_error() -> None:
    g = torch.ones(8)
    a = g.clone()
    a[3] = float("nan")
    m = measure(a, g)
    assert m.nonfinite_mismatch == 1 and m.actual_nan == 1 and m.golden_nan == 0
    assert math.isinf(m.rel_l2) and math.isinf(m.max_abs) and math.isinf(m.max_rel)
    a[3] = float("inf")
    m = measure(g, a)  # golden overflowed where actual did not
    assert m.golden_inf == 1 and math.isinf(m.rel_l2)
    b = torch.ones(8)
    b[3] = -float("inf")  # an infinity of the other sign is no agreement either
    assert math.isinf(measure(b, a).rel_l2)


def test_non_finite_alike_on_both_sides_is_counted_and_left_out() -> None:
    g = torch.tensor([1.0, float("nan"), float("-inf"), 2.0])
    a = torch.tensor([1.0, float("nan"), float("-inf"), 2.0])
    m = measure(a, g)
    assert m.rel_l2 == 0.0 and m.nonfinite_mismatch == 0
    assert (m.golden_nan, m.golden_inf, m.actual_nan, m.actual_inf) == (1, 1, 1, 1)
    assert not m.finite


def test_relative_l2_of_an_all_zero_golden_is_zero_only_when_equal() -> None:
    assert relative_l2(0.0, 0.0) == 0.0
    assert math.isinf(relative_l2(1e-30, 0.0))
    assert math.isinf(relative_l2(math.nan, 1.0))
    assert measure(torch.zeros(3), torch.zeros(3)).scale is None
    with pytest.raises(ValueError, match="elements"):
        measure(torch.zeros(3), torch.zeros(4))


# -- the ladder -----------------------------------------------------------------------------


def _m(level: str = "full", error: float = 0.0, **kw: object) -> SimpleNamespace:
    base = {"nan_mismatch": 0, "inf_mismatch": 0, "mismatched": None, "rerouted": None}
    return SimpleNamespace(level=level, error=error, **{**base, **kw})


@pytest.mark.parametrize(
    ("metrics", "allowed", "verdict"),
    [
        (_m(error=0.5, nan_mismatch=2), 1.0, "nonfinite"),  # non-finite first, whatever else
        (_m("exact", mismatched=3, inf_mismatch=1), 1.0, "nonfinite"),
        (_m("exact", mismatched=3), 1.0, "fail"),  # indices that differ
        (_m("exact", mismatched=0), 0.0, "pass"),
        (_m("exact", mismatched=3, rerouted=2), 0.0, "pass"),  # routing.py judges a router
        (_m("none", error=math.inf), 1.0, "fail"),  # a shape mismatch
        (_m("full", error=1e-3), 1e-3, "pass"),  # within what is allowed
        (_m("full", error=2e-3), 1e-3, "fail"),
    ],
)
def test_the_ladder_non_finite_then_exact_then_the_error(
    metrics: SimpleNamespace, allowed: float, verdict: str
) -> None:
    assert status(metrics, allowed) == verdict


def test_the_compare_and_replay_judges_climb_the_same_ladder() -> None:
    from precguard.compare import ExactMetrics, FullMetrics
    from precguard.compare.tolerance import get_profile, judge
    from precguard.localize.replay import judge_by_expected

    bad = FullMetrics(level="full", dtype="bfloat16", error=0.0, nan_mismatch=1, cosine=1.0,
                  max_abs_err=0.0)  # fmt: skip
    assert judge(bad, get_profile("default")) == judge_by_expected(bad, 1.0) == "nonfinite"
    assert ladder(bad) == "nonfinite"
    ids = ExactMetrics(level="exact", dtype="int64", error=0.0, mismatched=1)
    assert judge(ids, get_profile("fixed")) == judge_by_expected(ids, 1.0) == "fail"


# -- one definition each --------------------------------------------------------------------

#: the thresholds and tables numerics.py defines (read from it, so a new constant is held
#: too), and the private copies they replaced (compare/optimizer.py, compare/judge.py,
#: compare/sampled.py); nothing else assigns one of these names a value
CONSTANTS = frozenset(
    {name for name in vars(numerics) if name.isupper() and not name.startswith("_")}
    | {"_Z", "_DENSITY", "_GROWTH", "_BIAS_Z", "default_tolerance"}
)
#: the functions numerics.py defines (read from it); nothing else defines one of these names
FUNCTIONS = frozenset(
    name
    for name, value in vars(numerics).items()
    if callable(value)
    and getattr(value, "__module__", None) == numerics.__name__
    and not isinstance(value, type)
    and not name.startswith("_")
)
#: what the scan of literal judgements (:func:`_literal_judgements`) calls an error, a
#: tolerance or a threshold: a name (variable, attribute, string key) with one of these words
_JUDGED = re.compile(
    r"(^|_)(err|errs|error|errors|tol|tolerance|threshold|allowed|expected|amplification|"
    r"excess|margin)($|_)",
    re.IGNORECASE,
)
#: comparisons of a literal with an error that are not a judgement of one, each with why
NOT_A_JUDGEMENT = frozenset(
    {
        # fp64 probes of a module's structure (does it normalize? is it scale invariant?),
        # where a correct answer is exact up to fp64 rounding: what they compare is a
        # property of the code, not an error of a device
        ("checks/norm.py", "rel_error(y1, x.double()) > 0.001"),
        ("checks/norm.py", "rel_error(y3, y1) < 1e-09"),
        ("checks/norm.py", "row_error(y1, y0) < 1e-06"),
        # Ascend msprobe's own published rule, reproduced as its profile (compare/tolerance.py)
        ("compare/tolerance.py", "metrics.max_abs_err > 1.0"),
    }
)


def _literal_judgements(tree: ast.Module) -> list[tuple[int, str]]:
    """Comparisons in ``tree`` of a numeric literal against an error, a tolerance or a
    threshold: ``err > 8 * tol``, ``err < 2e-3``, ``x > 1 - 64 * eps_error``. Not counted:
    0 (a sign or an emptiness), a 1 added or subtracted (a ratio's unit: ``|r - 1|``,
    ``1 + tol``), subscripts (``allowed[-1]``) and counts (``len(errors) > 1``)."""

    def literal(node: ast.AST, parent: ast.AST | None) -> bool:
        if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
            return False
        if not isinstance(node.value, int | float) or node.value == 0:
            return False
        unit = node.value == 1 and isinstance(parent, ast.BinOp)
        return not (unit and isinstance(parent.op, ast.Add | ast.Sub))

    def scan(node: ast.AST, parent: ast.AST | None, names: set[str]) -> bool:
        if isinstance(node, ast.Subscript):
            names.update(_words(node.value))
            if isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
                names.add(node.slice.value)
            return scan(node.value, node, names)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "len":
            return False
        if isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.Attribute):
            names.add(node.attr)
        found = literal(node, parent)
        for child in ast.iter_child_nodes(node):
            found = scan(child, node, names) or found
        return found

    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names: set[str] = set()
            if scan(node, None, names) and any(_JUDGED.search(n) for n in names):
                out.append((node.lineno, ast.unparse(node)))
    return out


def _words(node: ast.AST) -> set[str]:
    return {getattr(n, "id", None) or getattr(n, "attr", "") for n in ast.walk(node)}


#: functions that divide the norm of a difference by a norm without being an error of
#: actual against golden: per-row norms, and a golden step's size relative to its weight
NOT_A_RELATIVE_ERROR = frozenset(
    {
        ("checks/norm.py", "row_error"),  # one error per row (a norm's rows), not per tensor
        ("compare/optimizer.py", "golden_updates"),  # the golden's own step size
        ("training/pulse.py", "collect"),  # per-row update sizes on the device, no golden
    }
)


def _modules() -> list[tuple[str, ast.Module]]:
    return [
        (str(p.relative_to(SRC)), ast.parse(p.read_text(encoding="utf-8")))
        for p in sorted(SRC.rglob("*.py"))
        if p != CORE
    ]


def _assigned(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else []
        if isinstance(node, ast.AnnAssign):
            targets = [node.target]
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _norm_of_a_difference_divided(fn: ast.FunctionDef) -> bool:
    """Whether ``fn`` takes the norm of a difference (``(a - b).norm()``, ``d = a - b;
    d.norm()``, ``vector_norm(a - b)``) and divides: a relative L2 error of its own."""
    diffs = {
        t.id
        for node in ast.walk(fn)
        if isinstance(node, ast.Assign)
        and isinstance(node.value, ast.BinOp)
        and isinstance(node.value.op, ast.Sub)
        for t in node.targets
        if isinstance(t, ast.Name)
    }

    def is_diff(x: ast.expr) -> bool:
        while isinstance(x, ast.Call) and isinstance(x.func, ast.Attribute):
            x = x.func.value  # (a - e).flatten(0, -2).norm(): through the chain
        return (isinstance(x, ast.BinOp) and isinstance(x.op, ast.Sub)) or (
            isinstance(x, ast.Name) and x.id in diffs
        )

    norms = False
    for node in ast.walk(fn):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
        if name == "norm" and isinstance(f, ast.Attribute) and is_diff(f.value):
            norms = True
        if name == "vector_norm" and node.args and is_diff(node.args[0]):
            norms = True
    divides = any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in ast.walk(fn))
    delegates = any(
        isinstance(n, ast.Call) and getattr(n.func, "id", None) in ("relative_l2", "measure")
        for n in ast.walk(fn)
    )
    return norms and divides and not delegates


def test_the_thresholds_are_defined_only_in_numerics() -> None:
    found = [f"{path}: {name}" for path, tree in _modules() for name in _assigned(tree) & CONSTANTS]
    assert not found, "define these once, in precguard/numerics.py:\n" + "\n".join(found)


def test_no_literal_is_compared_against_an_error_outside_numerics() -> None:
    """A judgement's number lives in numerics.py with its derivation, whatever its name."""
    found = [
        f"{path}:{line}: {text}"
        for path, tree in _modules()
        for line, text in _literal_judgements(tree)
        if (path, text) not in NOT_A_JUDGEMENT
    ]
    assert not found, "name the threshold in precguard/numerics.py:\n" + "\n".join(found)


def test_the_literal_scan_finds_the_old_inline_factors() -> None:
    """The scan can fail: the shapes the checks' and judges' factors were written in."""
    for text in (
        "bad = err > 8 * tol",
        "ok = max_rel_err < 2e-3",
        "flat = growth.factor > 4.0 * threshold",
        "bad = x['error'] > 1 - 64 * eps",
        "bad = err > LOGITS_SLACK * explained and err > 2.0 * worst_error",
    ):
        assert _literal_judgements(ast.parse(text)), text
    for text in ("ok = err > 0", "r = abs(ratio - 1) > tolerance", "n = len(errors) > 1"):
        assert not _literal_judgements(ast.parse(text)), text
    stale = {
        (path, text)
        for path, text in NOT_A_JUDGEMENT
        if text not in {t for _, t in _literal_judgements(ast.parse((SRC / path).read_text()))}
    }
    assert not stale, f"allow-list entries that no longer occur: {sorted(stale)}"


def test_the_floor_length_and_ladder_are_defined_only_in_numerics() -> None:
    found = [
        f"{path}:{node.lineno}: def {node.name}"
        for path, tree in _modules()
        for node in tree.body  # a method of that name (Probe.measure) is another verb
        if isinstance(node, ast.FunctionDef) and node.name in FUNCTIONS
    ]
    assert not found, "call precguard.numerics instead:\n" + "\n".join(found)


def test_no_module_computes_a_relative_l2_error_of_its_own() -> None:
    found = [
        f"{path}:{node.lineno}: {node.name}"
        for path, tree in _modules()
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef)
        and (path, node.name) not in NOT_A_RELATIVE_ERROR
        and _norm_of_a_difference_divided(node)
    ]
    assert not found, "measure with precguard.numerics.measure / relative_l2:\n" + "\n".join(found)


def test_the_scan_finds_a_planted_relative_error() -> None:
    """The checker can fail: the three ways the five old copies were written."""
    for text in (
        "def f(a, e):\n    return (a - e).norm() / e.norm()\n",
        "def f(a, e):\n    d = a - e\n    return float(d.norm()) / float(e.norm())\n",
        "def f(a, e):\n    return vector_norm(a - e) / vector_norm(e)\n",
    ):
        fn = ast.parse(text).body[0]
        assert isinstance(fn, ast.FunctionDef)
        assert _norm_of_a_difference_divided(fn), text
    ok = ast.parse("def f(a):\n    return a.norm() / 2\n").body[0]
    assert isinstance(ok, ast.FunctionDef) and not _norm_of_a_difference_divided(ok)


@pytest.mark.parametrize("fmt", ["float32", "float16", "bfloat16"])
def test_an_op_rounding_once_in_a_format_is_named_after_it(fmt: str) -> None:
    # the probes of checks/ops.py measure 0.2-1 unit roundoff for a correct op (bf16's from
    # 0.4); from 0.4 to 2.8 roundings an error is that format, not the next finer or coarser
    u = numerics.unit_roundoff(fmt)
    for err in (0.4 * u, u, 2.8 * u):
        assert numerics.precision_class(err) == fmt
    coarser = {"float32": "float16", "float16": "bfloat16", "bfloat16": "float8_e4m3fn"}[fmt]
    assert numerics.precision_class(numerics.unit_roundoff(coarser)) != fmt


def test_an_op_as_coarse_as_fp8_is_below_bfloat16() -> None:
    assert numerics.precision_class(numerics.unit_roundoff("float8_e4m3fn")) == "below bfloat16"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_shortest_rope_sweep_shows_angles_computed_in_the_compute_dtype(dtype) -> None:
    # the port bug at the sweep length numerics derives: angles in the compute dtype err
    # beyond twice the allowance in the last eighth of the positions, and 4x the first
    n = numerics.rope_sweep_positions(1.0)
    inv_freq = 1.0 / 10000 ** (torch.arange(0, 64, 2, dtype=torch.float64) / 64)
    p = torch.arange(n, dtype=torch.float64)
    exact = (p[:, None] * inv_freq).cos()
    low = (p.to(dtype)[:, None] * inv_freq.to(dtype)).double().cos()
    per_position = (low - exact).abs().amax(dim=1)
    first, last = (float(b.max()) for b in per_position.tensor_split(8)[::7])
    allowed = numerics.rope_allowed(float(torch.finfo(dtype).eps), float(p[-1]))
    assert last > 2 * allowed and last > 4 * max(first, float(torch.finfo(dtype).eps) / 2)
    # an fp32 angle stays inside the allowance there
    fp32 = (p.float()[:, None] * inv_freq.float()).double().cos()
    assert float((fp32 - exact).abs().max()) < allowed


def test_rope_allows_eight_roundings_of_its_compute_dtype_or_its_fp32_angles() -> None:
    eps = float(torch.finfo(torch.bfloat16).eps)
    assert numerics.rope_floor(eps) == numerics.PRECISION_STEP * numerics.unit_roundoff("bfloat16")
    # far along the sequence, the fp32 angle's roundings dominate
    far = numerics.rope_allowed(float(torch.finfo(torch.float32).eps), 1e5)
    assert far == numerics.ROPE_ANGLE_ROUNDINGS * numerics.unit_roundoff("float32") * (1 + 1e5)


def test_relative_l2_rows_is_relative_l2_per_row():
    diffs = torch.tensor([0.0, 1.0, 2.0, math.inf, 1.0, 0.0, 3.0], dtype=torch.float64)
    norms = torch.tensor([0.0, 0.0, 4.0, 1.0, math.nan, 3.0, math.inf], dtype=torch.float64)
    rows = numerics.relative_l2_rows(diffs, norms).tolist()
    each = [numerics.relative_l2(float(d), float(n)) for d, n in zip(diffs, norms, strict=True)]
    assert rows == each == [0.0, math.inf, 0.5, math.inf, math.inf, 0.0, math.inf]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_the_mask_floor_is_the_16_bit_floats_finfo_min_derived_from_their_bits(dtype) -> None:
    # a mask's stand-in for -inf: fp16's and bf16's most negative finite value, from their
    # exponent and significand bits (compare reads statistics without torch)
    name = str(dtype).removeprefix("torch.")
    want = float(torch.finfo(dtype).min) if dtype.itemsize == 2 else -math.inf
    assert numerics.mask_floor(name) == want
