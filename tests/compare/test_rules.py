"""The rules of compare's verdict: one list, four phases, one writer of a record's status."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import precguard
from precguard.compare import (
    BaseRule,
    Pass,
    RecordResult,
    Settlement,
    StepContext,
    get_profile,
    judge_unit,
    rules,
)
from tests.compare.synthetic import full_record as _rec

COMPARE = Path(precguard.__file__).resolve().parent / "compare"
GENERATION = COMPARE.parent / "generation"


class _CopiesItsWeight(BaseRule):
    """The worked example of docs/architecture.md: an embedding is allowed its weight's
    error, and nothing of its own."""

    @classmethod
    def for_step(cls, ctx: StepContext) -> _CopiesItsWeight | None:
        return cls() if ctx.profile.rule == "expected" else None

    def settle(self, r: RecordResult, s: Settlement, step: Pass) -> RecordResult:
        if (r.module_type, r.phase, r.role) != ("Embedding", "forward", "output"):
            return r
        reads = step.calls.reads((r.module, r.call))
        weight = next((x for x in reads if x.role == "param" and x.metrics), None)
        if weight is None or weight.metrics is None:
            return r
        s.allowed, s.ratio = weight.metrics.error, None
        return r.model_copy(update={"expected_error": weight.metrics.error})


def _embedding_step() -> list[RecordResult]:
    return [
        _rec("embed.0.forward.input.0", 0, 0.0, dtype="int64"),
        _rec("embed.0.forward.param.0", 1, 1e-3, module_type="Embedding"),
        # a lookup that copied rows of a weight 1e-3 off, and then rounded them again
        _rec("embed.0.forward.output.0", 2, 4e-3, module_type="Embedding"),
    ]


def test_a_new_rule_is_one_more_line_in_the_list(monkeypatch: pytest.MonkeyPatch) -> None:
    default = get_profile("default")
    before = {r.key: r for r in judge_unit(_embedding_step(), default).results}
    # the judge allows it amplification x its weight's error: a pass
    assert before["embed.0.forward.output.0"].status == "pass"

    listed = list(rules.RULES)
    at = listed.index(rules.ExpectedRule.for_step) + 1
    monkeypatch.setattr(rules, "RULES", (*listed[:at], _CopiesItsWeight.for_step, *listed[at:]))
    after = {r.key: r for r in judge_unit(_embedding_step(), default).results}

    # the rule allows it exactly its weight's error: 4x that fails, and the record says
    # what it was allowed (the one writer stored the rule's settlement)
    out = after["embed.0.forward.output.0"]
    assert out.status == "fail" and out.allowed_error == 1e-3
    assert after["embed.0.forward.param.0"].status == before["embed.0.forward.param.0"].status


def test_the_rules_run_in_the_listed_order() -> None:
    names = [make.__qualname__.split(".")[0] for make in rules.RULES]
    # the expected error (or a fixed profile) first, then the rules that refine it
    assert names[:2] == ["ExpectedRule", "ProfileRule"]
    assert names.index("RoutingRule") < names.index("LossRule")


def _status_writes(tree: ast.Module) -> list[int]:
    """Lines that set a record's status: a ``"status"`` key in a dict (a model_copy
    update), ``x["status"] = ...``, or ``status=`` passed to a constructor."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            keys = [k.value for k in node.keys if isinstance(k, ast.Constant)]
            if "status" in keys:
                out.append(node.lineno)
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.slice, ast.Constant)
            and node.slice.value == "status"
        ):
            out.append(node.lineno)
    return out


def test_only_the_one_pass_writes_a_records_status() -> None:
    found = {
        path.name: lines
        for path in sorted(COMPARE.glob("*.py"))
        if path.name != "verdict.py" and (lines := _status_writes(ast.parse(path.read_text())))
    }
    assert not found, f"a rule sets its Settlement; verdict.py writes the status: {found}"
    # the scan can fail: the shapes the old writers used
    for text in ('r.model_copy(update={"status": "fail"})', 'update["status"] = "fail"'):
        assert _status_writes(ast.parse(text)), text


def test_generate_diff_settles_a_cache_entry_through_the_same_status_call() -> None:
    # a KV-cache entry's status goes through numerics.status (kvcache.entry_status), as a
    # compared record's does: no module of generation/ writes one in a dict or an update
    found = {
        path.name: lines
        for path in sorted(GENERATION.glob("*.py"))
        if (lines := _status_writes(ast.parse(path.read_text())))
    }
    assert not found, f"generation/ settles a status through kvcache.entry_status: {found}"
