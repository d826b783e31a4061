"""A loss computed in low precision where golden computes it in float32: found by its dtype.

A log-softmax in bfloat16 loses about ``u * |logsumexp|`` nats per token, yet the loss's
value, a mean over tokens, stays within what bf16 explains; what tells the bug is the
precision the loss was computed in, which its output dtype keeps (docs/compare.md, "A
loss computed in low precision: judged by its dtype"). A loss record is a forward
scalar output of a module call that consumed floating logits of at least two
dimensions and integer labels, or of a module whose type ends in ``Loss``; the root's
outputs are not judged here. The rule (:class:`LossRule`) applies in compare's one
pass after the judge: its finding is the call's decision on that record, never
explained by a submodule.
"""

from __future__ import annotations

import math

from precguard.compare.calls import StepCalls
from precguard.compare.divergence import Candidate
from precguard.compare.report import RecordResult
from precguard.compare.rule import BaseRule, Explanations, Pass, Settlement, StepContext
from precguard.compare.tolerance import SIGNIFICAND_BITS, unit_roundoff

#: what the finding tells the user to do
REMEDY = (
    "compute the loss on float32 logits (logits.float() before log_softmax or "
    "cross_entropy), as golden does"
)


def _floating(dtype: str | None) -> bool:
    return dtype is not None and dtype in SIGNIFICAND_BITS


def is_loss(output: RecordResult, call: list[RecordResult]) -> bool:
    """Whether ``output`` is the loss its module call computed (module doc)."""
    if output.module == "root" or output.role != "output" or math.prod(output.shape) != 1:
        return False
    if not _floating(output.golden_dtype):
        return False
    inputs = [r for r in call if r.role == "input"]
    reduced = any(
        _floating(r.golden_dtype) and len(r.shape) >= 2 and r.shape[-1] >= 2 for r in inputs
    )
    labels = any(
        r.golden_dtype is not None and r.golden_dtype.startswith(("int", "uint")) for r in inputs
    )
    return reduced and (labels or output.module_type.endswith("Loss"))


def computed_in_low_precision(r: RecordResult) -> bool:
    """Whether the actual's loss is in a less precise floating dtype than golden's float32
    or wider one (a bfloat16 or float16 output: the precision it was computed in)."""
    if not (_floating(r.actual_dtype) and _floating(r.golden_dtype)):
        return False
    assert r.actual_dtype is not None
    golden_u = unit_roundoff(r.golden_dtype)
    return golden_u <= unit_roundoff("float32") and unit_roundoff(r.actual_dtype) > golden_u


def reason(r: RecordResult, logits: RecordResult | None) -> str:
    """The why line of a loss computed in low precision."""
    over = ""
    if logits is not None and logits.shape:
        over = f" over {logits.shape[-1]} classes"
    u = unit_roundoff(r.actual_dtype or "float32")
    value = f", {r.metrics.error:.3g} here" if r.metrics is not None else ""
    return (
        f"{r.module} ({r.module_type}) computes the loss in {r.actual_dtype} where golden "
        f"computes it in {r.golden_dtype}: a log-softmax{over} in {r.actual_dtype} loses "
        f"about {u:.3g} x |logsumexp| nats per token however small the loss (its value "
        f"can stay within rounding{value}: a mean over tokens hides it); {REMEDY}"
    )


def low_precision_loss(
    r: RecordResult, calls: StepCalls
) -> tuple[RecordResult, str, float | None] | None:
    """The rule at one judged record: a loss the actual computed in a less precise dtype
    than golden fails, local, with the why line of :func:`reason`; None for any other.

    ``calls``: the step's calls as settled so far (``r``'s call's inputs). Returns the
    record without an expected error or amplification (the finding is the precision,
    not a magnitude), the why line and the error of the logits it read.
    """
    m = r.metrics
    if not (
        r.phase == "forward"
        and r.role == "output"
        and m is not None
        and not (m.nan_mismatch or m.inf_mismatch)  # a non-finite loss is told as such
        and computed_in_low_precision(r)
    ):
        return None
    call = calls.reads((r.module, r.call))
    if not is_loss(r, call):
        return None
    logits = next((x for x in call if x.role == "input" and _floating(x.golden_dtype)), None)
    update = {"local": True, "amplification": None, "expected_error": None}
    r = r.model_copy(update=update)
    logits_error = None if logits is None or logits.metrics is None else logits.metrics.error
    return r, reason(r, logits), logits_error


class LossRule(BaseRule):
    """The rule as a phase of compare's one pass (compare/rules.py): at a forward record,
    after the judge, a loss computed in low precision fails with the rule's finding, which
    replaces the call's decision on it (never explained by a submodule; it explains the
    calls around it as any local call does)."""

    def __init__(self) -> None:
        self.found: dict[str, tuple[str, float | None]] = {}  # why line, logits' error; by key
        self.candidates: dict[str, Candidate] = {}

    @classmethod
    def for_step(cls, ctx: StepContext) -> LossRule:
        """The rule, at every step."""
        return cls()

    def settle(self, r: RecordResult, s: Settlement, step: Pass) -> RecordResult:
        """A loss computed in low precision: found, whatever its error."""
        found = low_precision_loss(r, step.calls)
        if found is None:
            return r
        r, why, logits_error = found
        s.explain_all()
        s.found = True
        self.found[r.key] = (why, logits_error)
        return r

    def written(self, r: RecordResult, step: Pass) -> None:
        """The finding, with the record as written (failing)."""
        found = self.found.pop(r.key, None)
        if found is not None:
            why, logits_error = found
            self.candidates[r.key] = Candidate(
                result=r, local=True, input_error=logits_error, reason=why
            )

    def explain(self, why: Explanations) -> None:
        """The findings decide their calls (divergence.decide_calls)."""
        why.settled.update(self.candidates)
