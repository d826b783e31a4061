"""Judge an optimizer step by the error its gradient explains, through the update rule.

Adam's first step is a sign: a gradient element within its error of zero may flip its
update from ``+lr`` to ``-lr`` in a correct run. An update (or the parameter after it)
is judged in two parts (docs/compare.md, "Optimizer steps judged through the update
rule"): the elements a flip or the gradient's element error explains, bounded one by
one (:func:`element_bound`) and counted as is; and the rest, ``2 e_g`` of the update
(``e_g`` the gradient's error), which the gate amplifies like any consumed error.
Optimizer records are the watch's ``backward.param`` records
(``optimizer.update.<param>``, ``optimizer.<state>.<param>``, see docs/watch.md);
``record --train`` keeps no update, so there the update is the golden's parameter at
this step less the one before (:func:`explain_params`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from precguard.compare.rule import BaseRule, StepContext
from precguard.dump.schema import Record
from precguard.numerics import Z_SCORE, ZERO_DENSITY

if TYPE_CHECKING:
    import torch

    #: where a record's saved tensor is read (None: not saved)
    Tensors = Callable[[Record], torch.Tensor | None]

#: name prefix of the watch's update records (training/handle.py ``_record_optimizer``)
UPDATE_PREFIX = "optimizer.update."


@dataclass(frozen=True)
class Explained:
    """The error an optimizer step explains on one update or parameter record."""

    #: relative error (to the record's golden norm) that elements whose gradient is
    #: within its error of zero may carry: a worst case, counted as is
    flipped: float
    #: relative error propagated from the gradient's error: amplified by the gate
    rest: float
    #: share of the elements whose gradient is within its error of zero (an upper
    #: bound when read from a sample)
    share: float
    #: the concentrated error (largest element, worst slice; of max|golden|) those
    #: elements may carry: a step from +U to -U
    peak: float = 0.0


def is_optimizer(phase: str, role: str) -> bool:
    """Whether a record of this phase and role is an optimizer record (update or state)."""
    return phase == "backward" and role == "param"


def is_update(rec: Record) -> bool:
    """Whether ``rec`` is an optimizer update record (the change a step made)."""
    return is_optimizer(rec.phase, rec.role) and rec.name.startswith(UPDATE_PREFIX)


def _full(rec: Record | None, tensors: Tensors) -> torch.Tensor | None:
    if rec is None or rec.tensor is None:
        return None
    t = tensors(rec)
    return None if t is None else t.detach().double().reshape(-1)


def _sampled(rec: Record | None, seed: int | None = None) -> np.ndarray | None:
    if rec is None or rec.sample is None or (seed is not None and rec.sample.seed != seed):
        return None
    values = rec.sample.array()
    return values if values.size else None


def _size(rec: Record, tensors: Tensors) -> tuple[torch.Tensor | None, float, float]:
    """(full tensor or None, l2, absmax) of a record: from its full tensor where kept,
    else from its statistics."""
    t = _full(rec, tensors)
    if t is not None:
        return t, float(t.norm()), float(t.abs().max()) if t.numel() else 0.0
    if rec.stats is None:
        return None, 0.0, 0.0
    return None, float(rec.stats.l2 or 0.0), float(rec.stats.absmax or 0.0)


def element_bound(u: np.ndarray | float, g: np.ndarray, d: np.ndarray, top: float) -> np.ndarray:
    """Per element, the most a correct optimizer's step may differ by, given its gradient's.

    ``u``: the golden's update elements (or their largest, ``top``, where unknown),
    ``g``: the golden's gradient elements, ``d``: their errors (actual - golden). First
    order ``|u| * 2 |d / g|``; where ``|d| >= |g|`` the sign may flip; never more than
    ``2 * top``. An element zero on both sides takes no step on either.
    """
    g, d = np.abs(g), np.abs(d)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(g > 0, d / np.where(g > 0, g, 1.0), np.where(d > 0, np.inf, 0.0))
    b = np.minimum(2.0 * np.abs(u) * rel, 2.0 * top)
    return np.where(d >= g, np.where(d > 0, 2.0 * top, 0.0), b)


def _explained(
    u_full: torch.Tensor | None,
    u_sample: np.ndarray | None,
    top: float,
    grad: Record,
    actual_grad: Record | None,
    g_tensors: Tensors,
    a_tensors: Tensors,
    grad_error: float,
    n: int,
) -> tuple[float, float, float]:
    """(l2, largest element, share of flippable elements) of what the step may differ by:
    element by element on full gradients, else on their sampled elements plus the flips
    the sample may have missed, else from the gradient's global error."""
    gg, ga = _full(grad, g_tensors), _full(actual_grad, a_tensors)
    gs = _sampled(grad)
    as_ = _sampled(actual_grad, grad.sample.seed if grad.sample is not None else None)
    u: np.ndarray | float = top
    if gg is not None and ga is not None and gg.shape == ga.shape and gg.numel() == n:
        if u_full is not None and u_full.numel() == n:
            u = u_full.abs().numpy()
        g, d = gg.numpy(), (ga - gg).numpy()
    elif gs is not None and as_ is not None and gs.size == as_.size:
        if u_sample is not None and u_sample.size == gs.size:
            u = u_sample
        g, d = gs, as_ - gs
    elif not math.isfinite(grad_error):
        return 2.0 * top * math.sqrt(n), 2.0 * top, 1.0
    else:
        # within Z_SCORE error standard deviations (e_g * rms(g)) of zero, for a density at
        # zero up to ZERO_DENSITY / rms(g) (precguard.numerics): f <= 2 * 3 * 1 * e_g
        f = min(1.0, 2.0 * Z_SCORE * ZERO_DENSITY * grad_error)
        return 2.0 * top * math.sqrt(f * n), (2.0 * top if f > 0 else 0.0), f
    b = element_bound(u, g, d, top)
    h = int(((np.abs(d) >= np.abs(g)) & (np.abs(d) > 0)).sum())
    if g.size >= n:  # every element: full tensors, or a sample of the whole tensor
        return float(np.sqrt(np.sum(b * b))), float(b.max()), h / n
    # flips the sample may have missed: the upper bound less those it saw
    f_up = min(1.0, (h + 3.0 * math.sqrt(h) + 3.0) / g.size)
    unseen = max(0.0, f_up - h / g.size) * n * (2.0 * top) ** 2
    l2 = math.sqrt(float(np.mean(b * b)) * n + unseen)
    return l2, 2.0 * top, f_up


def explain_update(
    update: Record,
    actual_update: Record | None,
    grad: Record | None,
    actual_grad: Record | None,
    grad_error: float,
    g_tensors: Tensors,
    a_tensors: Tensors,
) -> Explained:
    """The error a correct optimizer explains on ``update``, given its gradient's.

    ``grad_error``: the measured relative error of the gradient (its record's error).
    ``actual_update`` is not read: what the step may differ by is the golden's step
    and the gradients' errors, whatever the actual's step did.
    """
    del actual_update
    rest = 2.0 * grad_error if math.isfinite(grad_error) else math.inf
    if grad is None:
        return Explained(0.0, rest, 0.0)
    ug, l2, top = _size(update, g_tensors)
    if l2 == 0.0 or top == 0.0:
        return Explained(0.0, rest, 0.0)
    n = math.prod(update.shape) or 1
    us = _sampled(update, grad.sample.seed if grad.sample is not None else None)
    b_l2, b_max, share = _explained(
        ug, us, top, grad, actual_grad, g_tensors, a_tensors, grad_error, n
    )
    return Explained(min(2.0, b_l2 / l2), rest, share, min(2.0, b_max / top))


def explain_params(
    before: dict[str, Record],
    grads: dict[str, tuple[Record, Record | None, float]],
    now: list[Record],
    g_tensors: Tensors,
    a_tensors: Tensors,
) -> dict[str, Explained]:
    """Per parameter id (``module.index``): what the step since ``before`` explains on it.

    ``before``: the golden's parameter records of the last step compared, by key;
    ``grads``: per parameter id, that step's (golden gradient, actual gradient,
    measured error); ``now``: this step's golden parameter records. The golden's
    update is ``now - before`` (:func:`_delta`); a parameter whose step's gradient was
    not recorded is left out.
    """
    out: dict[str, Explained] = {}
    for rec in now:
        if rec.role != "param" or rec.phase != "forward":
            continue
        pid = param_id(rec)
        prev, grad = before.get(rec.key), grads.get(pid)
        if prev is None or grad is None or prev.shape != rec.shape or prev.step >= rec.step:
            continue
        _, norm, peak = _size(rec, g_tensors)
        delta, delta_sample, top, delta_l2 = _delta(prev, rec, g_tensors)
        if norm == 0.0 or delta_l2 is None:
            continue
        g, a, error = grad
        n = math.prod(rec.shape) or 1
        b_l2, b_max, share = _explained(
            delta, delta_sample, top, g, a, g_tensors, a_tensors, error, n
        )
        rest = 2.0 * error * delta_l2 / norm if math.isfinite(error) else math.inf
        out[pid] = Explained(
            min(2.0, b_l2 / norm), rest, share, min(2.0, b_max / peak) if peak > 0 else 0.0
        )
    return out


def _delta(
    prev: Record, now: Record, tensors: Tensors
) -> tuple[torch.Tensor | None, np.ndarray | None, float, float | None]:
    """The golden's update ``now - prev``: (full, sampled, largest element, l2 or None)."""
    a, b = _full(prev, tensors), _full(now, tensors)
    if a is not None and b is not None:
        d = b - a
        return d, None, (float(d.abs().max()) if d.numel() else 0.0), float(d.norm())
    pa, pb = _sampled(prev), _sampled(now)
    if pa is None or pb is None or prev.sample is None or now.sample is None:
        return None, None, 0.0, None
    if prev.sample.seed != now.sample.seed or pa.size != pb.size:
        return None, None, 0.0, None
    d = pb - pa
    n = math.prod(now.shape)
    return None, d, float(np.abs(d).max()), float(np.sqrt(np.mean(d * d) * n))


def update_allowance(
    explained: Explained, expected_rest: float, amplification: float, error: float = 0.0
) -> tuple[float, float, float]:
    """(allowed error, expected error, amplification of ``error``) of a record an
    optimizer step explains: the explained elements' error plus ``amplification`` times
    ``expected_rest`` (the propagated part, floored at rounding by the caller) is
    allowed; the expected error is their sum."""
    expected = explained.flipped + expected_rest
    allowed = explained.flipped + amplification * expected_rest
    return allowed, expected, (error / expected if expected > 0 else math.inf)


class StepTrail:
    """What one rank's last compared step leaves for the next: its golden parameters and
    its gradients (golden, actual, measured error), so the parameters after the
    optimizer step are judged with the error that step explains."""

    def __init__(self) -> None:
        self.params: dict[str, Record] = {}
        self.grads: dict[str, tuple[Record, Record | None, float]] = {}

    def explain(
        self,
        g_recs: list[Record],
        a_recs: list[Record],
        errors: dict[str, float],
        g_tensors: Tensors,
        a_tensors: Tensors,
    ) -> dict[str, Explained]:
        """Per golden record key: what the optimizer explains on this step's update
        records and on its parameters (the step before's update applied).

        ``errors``: the measured relative error of each compared record, by golden key;
        ``a_recs`` pair with ``g_recs`` by key.
        """
        # only gradients and updates are looked up (a key holds its phase and role): a big
        # step's records stay in their files (dump/step_records.py)
        by_key = {r.key: r for r in a_recs if r.role == "grad" or is_optimizer(r.phase, r.role)}
        stepped = explain_params(self.params, self.grads, g_recs, g_tensors, a_tensors)
        params = [r for r in g_recs if r.phase == "forward" and r.role == "param"]
        grads = [r for r in g_recs if r.phase == "backward" and r.role == "grad"]
        out = {rec.key: stepped[param_id(rec)] for rec in params if param_id(rec) in stepped}
        out |= _explain_updates(g_recs, grads, by_key, errors, g_tensors, a_tensors)
        self.params = {r.key: r for r in params} or self.params
        self.grads = {
            param_id(r): (r, by_key.get(r.key), errors.get(r.key, math.inf)) for r in grads
        }
        return out


def _explain_updates(
    g_recs: list[Record],
    grads: list[Record],
    by_key: dict[str, Record],
    errors: dict[str, float],
    g_tensors: Tensors,
    a_tensors: Tensors,
) -> dict[str, Explained]:
    """Per update record's key: what the optimizer explains on it, given its gradient's
    error (``by_key``: the actual's records)."""
    grad_of = {(rec.module, rec.name): rec for rec in grads}
    out: dict[str, Explained] = {}
    for rec in g_recs:
        if not is_update(rec):
            continue
        grad = grad_of.get((rec.module, rec.name[len(UPDATE_PREFIX) :]))
        a_grad = by_key.get(grad.key) if grad is not None else None
        error = errors.get(grad.key, math.inf) if grad is not None else math.inf
        out[rec.key] = explain_update(
            rec, by_key.get(rec.key), grad, a_grad, error, g_tensors, a_tensors
        )
    return out


def param_id(rec: Any) -> str:
    """A parameter's id across steps, ``module.index`` (the judge's keys too)."""
    return f"{rec.module}.{rec.index}"


def golden_updates(plan: Any, g_store: Any, rank: int, g_recs: list[Record]) -> dict[str, float]:
    """Per parameter: the golden optimizer step's relative size since the last step compared.

    ``max(||w_s - w_{s-1}|| / ||w_s||, max|w_s - w_{s-1}| / max|w_s|)``, from the
    golden's full tensors of both steps (held between units by ``plan.golden_params``).
    """
    out: dict[str, float] = {}
    held = plan.golden_params.setdefault(rank, {})
    for rec in g_recs:
        if rec.role != "param" or rec.phase != "forward" or rec.tensor is None:
            continue
        prev = held.get(rec.key)
        held[rec.key] = rec
        if prev is None or prev.step >= rec.step or prev.shape != rec.shape:
            continue
        now = g_store.tensor(rec).double()
        before = g_store.tensor(prev).double()
        delta = now - before
        norm, peak = float(now.norm()), float(now.abs().max()) if now.numel() else 0.0
        rel = float(delta.norm()) / norm if norm > 0 else 0.0
        rel_peak = float(delta.abs().max()) / peak if peak > 0 else 0.0
        out[param_id(rec)] = max(rel, rel_peak)
    return out


class OptimizerRule(BaseRule):
    """An optimizer's step as a rule of compare's one pass (compare/rules.py): it adjusts
    what the expected-error judge knows with the golden's step sizes and what each
    step explains of an update and of the parameters after it (:class:`StepTrail`)."""

    @classmethod
    def for_step(cls, ctx: StepContext) -> OptimizerRule | None:
        """The rule, in a comparison (it keeps the plan's trail) under the default profile."""
        if ctx.plan is None or ctx.stores is None or ctx.profile.rule != "expected":
            return None
        return cls()

    def adjust(self, ctx: StepContext) -> None:
        """The golden's step sizes and what the step explains (measured on the records as
        re-measured)."""
        g_store, a_store = ctx.stores  # type: ignore[misc]
        ctx.inputs.updates = golden_updates(ctx.plan, g_store, ctx.rank, ctx.g_recs)
        errors = {x.key: x.metrics.error for x in ctx.results if x.metrics is not None}
        trail = ctx.plan.trails.setdefault(ctx.rank, StepTrail())
        ctx.inputs.explained = trail.explain(
            ctx.g_recs, ctx.a_recs, errors, g_store.tensor, a_store.tensor
        )
