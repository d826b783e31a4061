"""Judge every record by the error its module's precision explains (the default gate).

Each record of a step is judged against its **expected error**
(:func:`precguard.numerics.expected_error`): one rounding in its precision, the
accumulation error of its reduction length, and the largest measured error of the
records it consumed (docs/compare.md, "Rounding is not a fault: the expected error",
tabulates what each kind of record consumed). A record stored in a wider dtype than
what it consumed is judged by the least precise dtype among them. The global error and
the concentrated error (worst slice, max-abs) are judged each against its consumed
counterpart; a record fails beyond ``profile.amplification`` times its expected error,
on a scale error its consumed records cannot explain
(:func:`precguard.compare.expected.own_bias`), or when NaN/Inf differ.

:class:`StepJudge` is the first phase of compare's one pass over a step
(compare/verdict.py): it takes the records in capture order and reads what a call
consumed, and its K, from the step's calls (compare/calls.py).
"""

from __future__ import annotations

import math
from array import array
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from precguard.compare.calls import StepCalls
from precguard.compare.expected import (
    BIAS_MAX_INPUT_ERROR,
    SCALED_LEVELS,
    carried_bias,
    linear_factors,
    own_bias,
    significant_scale,
)
from precguard.compare.levels import concentrated
from precguard.compare.optimizer import Explained, is_optimizer, param_id, update_allowance
from precguard.compare.report import Metrics, RecordResult
from precguard.compare.rule import BaseRule, Explanations, Pass, Settlement, StepContext
from precguard.compare.sampled import sampled_bounds
from precguard.compare.tolerance import Profile
from precguard.numerics import (
    DIFFERENCE_GROWTH,
    SIGNIFICAND_BITS,
    expected_error,
    ladder,
    less_precise,
    unit_roundoff,
)


@dataclass(slots=True)
class _Scope:
    """Running maxima of what a module's subtree recorded so far (one module's, read out
    of :class:`_Scopes`)."""

    err: float = 0.0  # global error
    conc: float = 0.0  # concentrated error
    dtype: str | None = None  # least precise float dtype seen
    bias: float = 0.0  # largest scale error a record carried (carried_bias)

    def merged(self, other: _Scope) -> _Scope:
        return _Scope(
            max(self.err, other.err),
            max(self.conc, other.conc),
            _least(self.dtype, other.dtype),
            max(self.bias, other.bias),
        )


@dataclass(frozen=True, slots=True)
class _Passed:
    """What one record passes on to each scope it joins (:meth:`_Scopes.add`)."""

    err: float
    conc: float
    own_bias: float  # its own scale error (carried_bias; 0 for a router's or a buffer's)
    rows_bias: float  # its error over every row (error_all_rows), 0 when none
    dtype: str | None  # its dtype, when a float one measured (else no change)


def _passed(m: Metrics, e: float, c: float, profile: Profile, bias: bool = True) -> _Passed:
    """What ``m`` passes on, errors ``e`` and ``c``: no scale is carried from a router's
    indices (routing.py) nor from a buffer (``bias`` False); a record compared on the rows
    routed alike passes on every row's error, which moves a least-squares scale by up to
    that error."""
    routed = m.level == "exact" and m.rerouted is not None
    own = 0.0 if routed or not bias else carried_bias([m], profile)
    dtype = m.dtype if m.level in ("full", "stats") else None
    return _Passed(e, c, own, m.error_all_rows or 0.0, dtype)


#: dtype names by number in :class:`_Scopes` (0: a scope never used, 1: no dtype yet)
_DTYPES: list[str | None] = [None, None]
_DTYPE_NUMBERS: dict[str | None, int] = {None: 1}


def _dtype_number(dtype: str | None) -> int:
    n = _DTYPE_NUMBERS.get(dtype)
    if n is None:
        n = _DTYPE_NUMBERS[dtype] = len(_DTYPES)
        _DTYPES.append(dtype)
    return n


class _Scopes:
    """Running maxima of every module's subtree (:class:`_Scope`), in arrays by module
    number (:class:`~precguard.compare.calls.ModuleIds`): a step may hold millions of
    modules, each with its enclosing ones. A module's scope starts empty when first used,
    as a ``defaultdict(_Scope)``'s would (:meth:`used` tells whether it was)."""

    def __init__(self) -> None:
        self.err = array("d")
        self.conc = array("d")
        self.bias = array("d")
        self.dtype = array("H")  # _DTYPES' number; 0: never used

    def _grow(self, i: int) -> None:
        more = i + 1 - len(self.dtype)
        if more > 0:  # an array's own growth is amortized: no slack needed here
            zeros = bytes(8 * more)  # 0.0
            self.err.frombytes(zeros)
            self.conc.frombytes(zeros)
            self.bias.frombytes(zeros)
            self.dtype.frombytes(bytes(2 * more))

    def used(self, i: int) -> bool:
        """Whether the scope of module ``i`` was read or added to."""
        return i < len(self.dtype) and self.dtype[i] != 0

    def get(self, i: int) -> _Scope:
        """Module ``i``'s scope as it stands (a copy)."""
        self._grow(i)
        if self.dtype[i] == 0:
            self.dtype[i] = 1
        return _Scope(self.err[i], self.conc[i], _DTYPES[self.dtype[i]], self.bias[i])

    def reset(self, i: int) -> None:
        """Module ``i``'s scope starts again, empty (a new call of it)."""
        self._grow(i)
        self.err[i] = self.conc[i] = self.bias[i] = 0.0
        self.dtype[i] = 1

    def add(self, i: int, p: _Passed) -> None:
        """What a record passes on joins module ``i``'s scope."""
        self._grow(i)
        self.err[i] = max(self.err[i], p.err)
        self.conc[i] = max(self.conc[i], p.conc)
        self.bias[i] = max(self.bias[i], p.own_bias, p.rows_bias)
        d = self.dtype[i]
        if p.dtype is not None:
            known = _DTYPES[d]
            if known != p.dtype:  # else the least precise of the two is the same
                d = _dtype_number(_least(known, p.dtype))
        elif d == 0:
            d = 1  # used, no dtype yet
        self.dtype[i] = d


def _least(first: str | None, second: str | None) -> str | None:
    """The less precise of two dtypes (:func:`less_precise`), either None when unknown."""
    if first is None or second is None:
        return second if first is None else first
    return less_precise(first, second)


def measured_errors(m: Metrics) -> tuple[float, float]:
    """(global error, concentrated error) of one record; exact records: 0 or inf (0 for a
    router's indices, whose re-routing routing.py judges and whose followers it compares
    on the rows routed alike)."""
    if m.level == "exact":
        e = math.inf if m.mismatched and m.rerouted is None else 0.0
        return e, e
    e = m.error if math.isfinite(m.error) else math.inf
    conc = max(x for x in (e, *concentrated(m)) if x is not None)
    return e, conc if math.isfinite(conc) else math.inf


def _bounds(m: Metrics, profile: Profile) -> tuple[tuple[float, float], tuple[float, float]]:
    """(global, concentrated) errors at least and at most (what it may carry): a record's
    measured ones, or a statistics-only record's sampled bounds (:func:`sampled_bounds`)."""
    if m.level == "stats":
        return sampled_bounds(m, profile.bias_z)
    measured = measured_errors(m)
    return measured, measured


def passed_on(m: Metrics, e: float, c: float) -> tuple[float, float]:
    """The errors a record passes on to what consumes it: its measured ones, or, for one
    compared on the rows a router routed alike (routing.py), its error over every row."""
    if m.error_all_rows is None:
        return e, c
    return max(e, m.error_all_rows), max(c, m.conc_all_rows or m.error_all_rows)


@dataclass
class JudgeInputs:
    """What the expected-error judge knows of a step besides its records (None: nothing).

    Per parameter (module and index): ``previous``, the error its gradient (or itself)
    carried at the step before (:meth:`StepJudge.carried_on`); ``updates``, the relative
    size of the golden's optimizer step (``optimizer.golden_updates``). Per record key:
    ``calibrated``, the (global, concentrated) error a calibration run showed
    (:mod:`precguard.compare.calibrate`); ``explained``, what an optimizer step explains
    (:mod:`precguard.compare.optimizer`), in place of ``updates``.
    """

    previous: dict[str, float] | None = None
    updates: dict[str, float] | None = None
    calibrated: dict[str, tuple[float, float]] | None = None
    explained: dict[str, Explained] | None = None


class StepJudge:
    """The expected-error judge of one rank and step (the module doc): it keeps the running
    maxima of every module's subtree (forward in the current call and in the step, backward
    so far) and reads what a call consumed, and its K, from ``calls``."""

    def __init__(
        self,
        results: Iterable[RecordResult],
        profile: Profile,
        calls: StepCalls,
        inputs: JudgeInputs | None = None,
    ) -> None:
        inputs = inputs or JudgeInputs()
        self.profile = profile
        self.calls = calls
        self.previous = inputs.previous or {}
        self.updates = inputs.updates or {}
        self.calibrated = inputs.calibrated or {}
        self.explained = inputs.explained or {}
        # modules by their number in calls.modules (a step may hold millions of them)
        self.modules = calls.modules
        self.fwd = _Scopes()  # subtree records of the current call
        self.fwd_all = _Scopes()  # subtree records of the step
        self.bwd = _Scopes()  # subtree backward records so far
        # the inputs of the submodules a module called so far in the step: what the code
        # between them consumed
        self.sub_inputs: dict[int, list[RecordResult]] = defaultdict(list)
        self.carried: dict[str, float] = {}
        self.stepped_errors: dict[str, float] = {}  # parameters' errors a step explains
        self.glue_bad: set[int] = set()  # modules whose code between submodules made error
        self.open_calls: list[int] = []  # forward calls whose outputs are not recorded yet
        #: the modules measured (a flag by number); the forward calls whose output is (by
        #: calls' number): only those are opened (one without, a module returning no
        #: tensor, would stay open for the rest of the step, taking in every later
        #: record); per forward parameter measured, its id and the error it passes on
        #: (:meth:`carried_on`); whether the actual was trained apart
        self.called = bytearray()
        self.closing = bytearray()
        self.params: list[tuple[str, float]] = []
        self.apart = False
        for r in results:  # read once (a step may hold millions)
            if r.metrics is None:
                continue
            _flag(self.called, self.modules.number(r.module))
            # numbers every call as calls.add would, in the same order (its first record)
            n = calls.number(r)
            if r.phase == "forward" and r.role == "output":
                _flag(self.closing, n)
            if r.phase == "forward" and r.role == "param":
                self.params.append((param_id(r), _bounds(r.metrics, profile)[1][0]))
            self.apart = self.apart or _trained_apart(r, self.updates)
        #: what :meth:`judge` leaves for :meth:`take`: the enclosing module, whether the
        #: judge failed the record, and the errors it passes on
        self._taking: tuple[int | None, bool, float, float] = (None, False, 0.0, 0.0)

    def judge(self, r: RecordResult, s: Settlement) -> RecordResult:
        """``r`` (measured, the next in capture order) with its expected error and
        amplification set, and what it is allowed in ``s``; once its status is written,
        :meth:`take` takes what it passes on into its enclosing scopes."""
        m = r.metrics
        assert m is not None
        # statistics only: judged by the lower bounds of its sampled errors, and passing
        # their upper bounds on (sampled.py: a sample's estimate carries its uncertainty)
        (low_e, low_c), (e, c) = _bounds(m, self.profile)
        fparent: int | None = None
        if r.phase == "forward":
            fparent = self._enclosing(r)
            scope, consumed, k = self._forward_scope(r, fparent)
        else:
            scope, consumed, k = self._backward_scope(r)
        cal = self.calibrated.get(r.key)
        if cal is not None:
            scope = scope.merged(_Scope(cal[0], cal[1]))
        stepped = self.explained.get(r.key)
        judged = _judge(
            r, m, low_e, low_c, scope, consumed, k, self.profile, s, stepped,
            scale_test=not (self.apart and r.phase == "backward"),
        )  # fmt: skip
        if stepped is not None and r.role == "param" and m.level == "stats":
            # statistics cannot see which elements an optimizer step flipped: what
            # consumes this parameter consumes the error the step explains
            e, c = max(e, stepped.flipped + stepped.rest), max(c, stepped.peak)
            self.stepped_errors[param_id(r)] = e
        if (
            r.phase == "forward"
            and r.role == "output"
            and self.modules.number(r.module) in self.glue_bad
        ):
            s.found = True  # the module's own code between its submodules made error
        # the judge's own verdict marks the enclosing module (a rule after it may settle
        # the record otherwise: a router's follower, by the router's verdict)
        failed = s.verdict(m) == "fail"
        self._taking = (fparent, failed, *passed_on(m, e, c))
        return judged

    def take(self, r: RecordResult) -> None:
        """The record :meth:`judge` judged, its status written: what it passes on joins its
        enclosing scopes, and a failing submodule input marks the enclosing module (whose
        own code between its submodules made it)."""
        fparent, failed, e, c = self._taking
        m = r.metrics
        assert m is not None
        ancestors = self.modules.ancestors(r.module)
        if r.phase != "forward":
            passed = _passed(m, e, c, self.profile)
            for i in ancestors:
                self.bwd.add(i, passed)
            if r.role == "grad":
                pid = param_id(r)
                self.carried[pid] = max(e, self.carried.get(pid, 0.0))
            return
        if r.role == "input" and fparent is not None:
            self.sub_inputs[fparent].append(r)
            if failed:
                self.glue_bad.add(fparent)
        if r.role == "buffer":
            ins = [
                _bounds(x.metrics, self.profile)[1][0]
                for x in self.calls.reads((r.module, r.call))
                if x.metrics
            ]
            self.carried[_buffer_id(r)] = max([e, *ins])
        # a module's outputs do not feed one another: they count for its ancestors
        # (by name, and every call still open around it)
        module = ancestors[0]
        own = r.role != "output"
        enclosing = {*ancestors[1:], *self.open_calls} - {module}
        # a buffer's rounding is one rounding of a constant, often a short one (32
        # frequencies): its scale's standard error says nothing of what reads it
        passed = _passed(m, e, c, self.profile, bias=r.role != "buffer")
        for i in [module] * own + sorted(enclosing):
            self.fwd.add(i, passed)
        for i in {module, *enclosing}:
            self.fwd_all.add(i, passed)
        if r.role == "output" and module in self.open_calls:
            while self.open_calls and self.open_calls.pop() != module:
                pass

    def _parent(self, module: str) -> int | None:
        """The innermost module enclosing ``module`` that was called (a ModuleList never
        is), by number."""
        called = self.called
        return next(
            (i for i in self.modules.ancestors(module)[1:] if i < len(called) and called[i]),
            None,
        )

    def _enclosing(self, r: RecordResult) -> int | None:
        """The enclosing module of a forward record: the innermost call still open (a
        collective's dist.<op> record sits inside the module that called it, whatever its
        name), else by name; a record opening a call of its module starts it."""
        module = self.modules.number(r.module)
        fparent = next((n for n in reversed(self.open_calls) if n != module), None)
        if fparent is None:
            fparent = self._parent(r.module)
        call = (r.module, r.call)
        if r.role in ("input", "param", "buffer") and not self.calls.opened(call):
            self.fwd.reset(module)  # a new call of this module starts
            self.glue_bad.discard(module)
            n = self.calls.forward_number(call)
            if 0 <= n < len(self.closing) and self.closing[n]:
                self.open_calls.append(module)
        return fparent

    def _forward_scope(
        self, r: RecordResult, fparent: int | None
    ) -> tuple[_Scope, list[RecordResult], int | None]:
        """What a forward record consumed: (its scope, the records, K)."""
        if r.role == "input":
            scope = self.fwd.get(fparent) if fparent is not None else _Scope()
            return scope, ([] if fparent is None else self.sub_inputs[fparent]), None
        if r.role in ("buffer", "param"):
            # one rounding; after the first step, what it carried out of the step before (a
            # norm's running statistics too) and, for a parameter, what its update explains
            pid = param_id(r) if r.role == "param" else _buffer_id(r)
            prior = self.previous.get(pid)
            if prior is not None and r.role == "param":
                ex = self.explained.get(r.key)
                prior += DIFFERENCE_GROWTH * self.updates.get(pid, 0.0) if ex is None else ex.rest
            err = 0.0 if prior is None else prior
            return _Scope(err, err), [], None
        call = (r.module, r.call)
        scope = self.fwd.get(self.modules.number(r.module))
        return scope, self.calls.reads(call), self.calls.reduction(call, False)

    def _backward_scope(self, r: RecordResult) -> tuple[_Scope, list[RecordResult], int | None]:
        """What a backward record consumed: (its scope, the records, K)."""
        ancestors = self.modules.ancestors(r.module)
        forward_scope = self.fwd_all.get(ancestors[0])
        if r.role == "output":
            # recorded before the enclosing modules' (hooks on one tensor fire inner first):
            # it came from the innermost enclosing module whose backward recorded something
            parent = self._parent(r.module)
            scope = self.fwd_all.get(parent if parent is not None else ancestors[0])
            for i in ancestors[1:]:
                if self.bwd.used(i):
                    scope = scope.merged(self.bwd.get(i))
                    break
            return scope, [], None
        call = (r.module, r.call)
        scope = self.bwd.get(ancestors[0]).merged(forward_scope)
        ex = self.explained.get(r.key)
        if is_optimizer(r.phase, r.role) and ex is not None:
            # an update consumed its gradient, through the update rule: the share of
            # elements it may flip may also shift its scale by 2f
            return _Scope(ex.rest, ex.rest, scope.dtype, scope.bias + ex.share), [], None
        consumed = [*self.calls.reads(call), *self.calls.output_grads(call)]
        return scope, consumed, self.calls.reduction(call, True)

    def carried_on(self) -> dict[str, float]:
        """Per parameter and buffer: the error it carries into the next step (``previous``)."""
        for pid, passed in self.params:
            own = max(passed, self.stepped_errors.get(pid, 0.0))
            self.carried[pid] = max(self.carried.get(pid, 0.0), own)
        return self.carried


class ExpectedRule(BaseRule):
    """The expected-error judge as a rule of compare's one pass (compare/rules.py): it
    adjusts what the judge knows with the error each parameter carried out of the step
    before, settles each record by :class:`StepJudge`, and leaves for the next step what
    this one carries (under the ``expected`` profile rule only)."""

    def __init__(self, ctx: StepContext) -> None:
        self.ctx = ctx
        self.judge: StepJudge | None = None

    @classmethod
    def for_step(cls, ctx: StepContext) -> ExpectedRule | None:
        """The rule, under the default profile (``rule == "expected"``)."""
        return cls(ctx) if ctx.profile.rule == "expected" else None

    def adjust(self, ctx: StepContext) -> None:
        """The error each parameter's gradient carried at the step before (the plan's)."""
        if ctx.plan is not None and ctx.step > 0:
            ctx.inputs.previous = ctx.plan.carried.get(ctx.rank)

    def settle(self, r: RecordResult, s: Settlement, step: Pass) -> RecordResult:
        """The record against the error what it consumed explains."""
        if self.judge is None:  # the step's records as re-measured, the calls of the pass
            self.judge = StepJudge(self.ctx.results, self.ctx.profile, step.calls, self.ctx.inputs)
        return self.judge.judge(r, s)

    def written(self, r: RecordResult, step: Pass) -> None:
        """What the record passes on joins its scopes."""
        if self.judge is not None and r.metrics is not None:
            self.judge.take(r)

    def explain(self, why: Explanations) -> None:
        """What this step carries into the next (kept by the plan, per rank)."""
        results = self.ctx.results
        judge = self.judge or StepJudge(results, self.ctx.profile, StepCalls(results))
        why.carried = judge.carried_on()
        if self.ctx.plan is not None:
            self.ctx.plan.carried[self.ctx.rank] = why.carried


def _trained_apart(r: RecordResult, updates: dict[str, float]) -> bool:
    """Whether the actual's parameter ``r`` lost the golden's last optimizer step to rounding
    (a step below a stored weight's unit roundoff): every gradient then differs
    systematically, no module's own scale error, so backward records are judged by
    amplification only."""
    m = r.metrics
    if r.role != "param" or m is None or m.level not in SCALED_LEVELS:
        return False
    # the dtype the actual *stores* its weights in: fp32 master weights under
    # autocast take every step, whatever precision the forward computes in
    stored = r.actual_dtype or r.golden_dtype
    if stored not in SIGNIFICAND_BITS:
        return False
    step = updates.get(param_id(r))
    return step is not None and 0.0 < step < unit_roundoff(stored)


def _flag(flags: bytearray, i: int) -> None:
    """Set flag ``i``, growing ``flags`` to hold it."""
    if i >= len(flags):
        flags.extend(bytes(i + 1 - len(flags)))
    flags[i] = 1


def _buffer_id(r: RecordResult) -> str:
    return f"{r.module}.buffer.{r.index}"


def _own_bias(
    r: RecordResult,
    m: Metrics,
    scope: _Scope,
    consumed: list[RecordResult],
    profile: Profile,
    k: int | None = None,
) -> bool:
    """Whether ``m``'s significant scale error is the record's own, not carried in
    (:func:`~precguard.compare.expected.own_bias`, with what the record's scope consumed):
    through its factors when it is linear in what it consumed (:func:`linear_factors`)
    and nothing else it consumed carries more error, else against its scope's errors.
    """
    factors = linear_factors(r.module_type, r.phase, r.role, r.index, consumed)
    if factors is not None and m.level in SCALED_LEVELS:
        known = [x.metrics for x in consumed if x.metrics is not None]
        # and nothing else it consumed (a collective it called) carries more error (a
        # statistics-only record counts by the upper bound it passed on to the scope)
        worst = max((_bounds(x, profile)[1][0] for x in known), default=0.0)
        alone = r.phase == "backward" or scope.err <= worst
        if alone and not any(x.error > BIAS_MAX_INPUT_ERROR for x in known):
            excess = own_bias(
                m, profile, input_error=0.0, carried=0.0, k=k, factors=factors,
                module_type=r.module_type,
            )  # fmt: skip
            return excess is not None
    param = r.role == "param"
    return (
        own_bias(m, profile, input_error=scope.err, carried=scope.bias, k=k, param=param)
        is not None
    )


def _same_initial_weights(r: RecordResult, m: Metrics, stepped: Explained | None) -> bool:
    """A parameter of the first step, stored in the same (floating) dtype on both sides."""
    return (
        r.role == "param"
        and r.phase == "forward"  # not an optimizer's update (the watch's backward params)
        and r.step == 0
        and stepped is None
        and m.level in ("full", "stats")
        and r.actual_dtype is not None
        and r.actual_dtype == r.golden_dtype
        and r.golden_dtype.startswith(("float", "bfloat"))
    )


def _judge(
    r: RecordResult,
    m: Metrics,
    e: float,
    c: float,
    scope: _Scope,
    consumed: list[RecordResult],
    k: int | None,
    profile: Profile,
    s: Settlement,
    stepped: Explained | None = None,
    *,
    scale_test: bool = True,
) -> RecordResult:
    """One record against what its scope explains (and, for an optimizer update or a
    parameter after a step, what the step explains: ``stepped``; ``scale_test``: and its
    own scale): its figures on the record, what it is allowed in ``s``."""
    # non-finite, exact (a router's indices: routing.py), nothing measurable
    if ladder(m) is not None:
        return r
    dtype = _least(m.dtype, scope.dtype)
    if _same_initial_weights(r, m, stepped):
        # nothing computed two copies of the initial weights stored in one dtype (an emu:
        # profile or autocast rounds what reads them): judged at the dtype they are stored in
        dtype = r.golden_dtype
    expected = expected_error(scope.err, dtype, k)
    expected_conc = expected_error(scope.conc, dtype, k)
    amp = max(e / expected, c / expected_conc) if expected > 0 else math.inf
    s.allowed = profile.amplification * expected
    s.ratio = amp / profile.amplification  # above 1 exactly when amp is above the gate
    if stepped is not None and (r.role == "param" or r.phase == "backward"):
        allowed, expected, amp = update_allowance(stepped, expected, profile.amplification, e)
        # an element whose gradient is within its error of zero may step from +U to -U:
        # the largest element and the worst slice may then differ by 2 (of max|golden|)
        allowed_conc = stepped.peak + profile.amplification * expected_conc
        s.allowed, s.ratio = allowed, max(_over(e, allowed), _over(c, allowed_conc))
    over = s.ratio is not None and s.ratio > 1.0
    if not over and scale_test and significant_scale(m, profile):
        s.found = _own_bias(r, m, scope, consumed, profile, k)
    if m.level == "stats" and m.error <= expected:
        # statistics only: the concentrated evidence is an estimate, and an error no larger
        # than what the inputs explain is never a finding
        s.ratio, s.found = min(s.ratio, 1.0), False
    amp_or_none = amp if math.isfinite(amp) else None
    return r.model_copy(update={"expected_error": expected, "amplification": amp_or_none})


def _over(error: float, allowed: float) -> float:
    """``error / allowed``: above 1 exactly when ``error`` is above ``allowed`` (inf when
    nothing is allowed and there is error, 0 when neither)."""
    if allowed > 0:
        return error / allowed
    return math.inf if error > 0 else 0.0
