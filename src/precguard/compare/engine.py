"""``precguard.compare_runs``: stream two recordings, pair their records, judge, localize.

Records are read one step at a time from both recordings (``records.jsonl``
is written in step order), so memory holds one step's metadata and one pair
of chunks of tensor data, whatever the size of the run.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from precguard._logging import get_logger
from precguard.compare import hints
from precguard.compare.align import (
    WRAPPER_TYPES,
    InOrder,
    Renamer,
    align,
    fsdp2_class,
    pairs_in_order,
)
from precguard.compare.coverage import (
    Coverage,
    CoverageTracker,
    ensure_distinct,
    incomplete_note,
)
from precguard.compare.divergence import (
    Candidate,
    decide_ranks,
    decoding_divergence,
    further_findings,
    rank_suspects,
)
from precguard.compare.judge import measured_errors
from precguard.compare.levels import UnmeasuredMetrics
from precguard.compare.metrics import (
    golden_rms,
    precision,
    stats_metrics,
    tensor_metrics,
    tolerance_dtype,
)
from precguard.compare.optimizer import StepTrail
from precguard.compare.options import CompareOptions
from precguard.compare.padding import (
    LeftOut,
    StepPadding,
    mask_metrics,
    mask_stats_metrics,
    padding_note,
)
from precguard.compare.report import (
    Comparison,
    Counts,
    Metrics,
    RecordIdentity,
    RecordResult,
    RecordRows,
    Status,
    Unmatched,
)
from precguard.compare.routing import Routing
from precguard.compare.routing_find import is_index_dtype
from precguard.compare.rule import Explanations, StepContext
from precguard.compare.tolerance import Profile, with_bias
from precguard.compare.units import OneSided, ShardResult, UnitResult
from precguard.compare.verdict import JudgeInputs, run_rules
from precguard.dump.paths import RECORDS_FILE, rank_dir
from precguard.dump.reader import Run, load_run
from precguard.dump.schema import Record
from precguard.dump.step_records import StepRecords
from precguard.dump.tensors import TensorStore
from precguard.errors import DumpFormatError, PrecguardError, UsageError
from precguard.text import shown

logger = get_logger(__name__)

#: aligned pairs must number at least this share of the unmatched records of either
#: side, or the recordings are taken to be of different models
MIN_ALIGNED_SHARE = 0.5


class IncomparableRunsError(PrecguardError):
    """The two recordings are not of the same model (or share no rank or step)."""


class ComparePlan:
    """What every process of a comparison agrees on before any unit is compared.

    Built the same way from the same :class:`~precguard.compare.options.CompareOptions`
    in each worker process, so a worker needs only :attr:`arguments` (the two paths
    and the options' JSON), never a pickled object.
    """

    def __init__(
        self,
        g_run: Run,
        a_run: Run,
        options: CompareOptions,
        renamer: Renamer,
        warnings: list[str],
        ranks: list[int],
    ) -> None:
        self.g_run = g_run
        self.a_run = a_run
        self.options = options
        self.prof = options.resolved_profile()
        #: the options' tolerance dtype (aliases resolved), and the only rank and step
        #: compared when the options name them
        self.tolerance_dtype = options.tolerance_dtype
        self.rank, self.step = options.rank, options.step
        self.computes = (g_run.manifest.compute_dtype, a_run.manifest.compute_dtype)
        self.renamer = renamer
        self.warnings = warnings
        self.ranks = ranks
        #: what a worker process rebuilds the plan from (:func:`plan_from_arguments`)
        self.arguments: dict[str, Any] = {
            "golden": str(g_run.path),
            "actual": str(a_run.path),
            "options": options.model_dump(mode="json"),
        }
        #: per rank: the error each parameter's gradient carried at the last step compared
        self.carried: dict[int, dict[str, float]] = {}
        #: per rank: the golden's parameter records of the last step compared, by key
        self.golden_params: dict[int, dict[str, Record]] = {}
        #: per rank: the parameters and gradients of the last step compared, for the
        #: optimizer's update rule (compare/optimizer.py)
        self.trails: dict[int, StepTrail] = {}
        #: a calibration recording (the golden's code at its own precision, inputs perturbed
        #: by one unit roundoff: calibrate.perturb_inputs), if any
        self.calibration = None if options.calibration is None else load_run(options.calibration)
        #: keys of another tool's extra detail (msprobe's API-level records: compare_runs
        #: sets it from precguard.interop): unmatched, no evidence of a different model
        self.is_detail: Callable[[str], bool] = lambda _key: False
        self._calibration_records: dict[int, dict[tuple[int, str], Record]] = {}

    def calibration_records(self, rank: int) -> dict[tuple[int, str], Record]:
        """The calibration run's records of ``rank`` by (step, key), read once."""
        if self.calibration is None:
            return {}
        if rank not in self._calibration_records:
            recs = self.calibration.records(rank) if rank in self.calibration.ranks else []
            self._calibration_records[rank] = {(r.step, r.key): r for r in recs}
        return self._calibration_records[rank]


def plan_comparison(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    options: CompareOptions | None = None,
    *,
    check_distinct: bool = True,
) -> ComparePlan:
    """Open both recordings and settle everything the units share (see ``compare_runs``)."""
    options = options if options is not None else CompareOptions()
    g_run = golden if isinstance(golden, Run) else load_run(golden)
    a_run = actual if isinstance(actual, Run) else load_run(actual)
    if check_distinct:
        ensure_distinct(g_run, a_run)
    renamer = Renamer.from_strings(options.rename)  # a malformed --map is told first
    warnings = _check_models(g_run, a_run, renamed=bool(options.rename))
    warnings.extend(hints.recomputation_notes(g_run, a_run))
    ranks = _ranks(g_run, a_run, options.rank, warnings)
    return ComparePlan(g_run, a_run, options, renamer, warnings, ranks)


def plan_from_arguments(arguments: dict[str, Any]) -> ComparePlan:
    """Rebuild a :class:`ComparePlan` in a worker from :attr:`ComparePlan.arguments`."""
    return plan_comparison(
        arguments["golden"],
        arguments["actual"],
        CompareOptions.model_validate(arguments["options"]),
        check_distinct=False,  # the coordinating process checked
    )


def compare_unit(
    plan: ComparePlan,
    g_store: TensorStore,
    a_store: TensorStore,
    r: int,
    s: int,
    g_recs: Sequence[Record],
    a_recs: Sequence[Record],
) -> UnitResult:
    """Compare the records of one rank and step; every worker calls this per unit.

    When only one side recorded collectives (``dist.<op>`` records: a distributed
    run against a single-process golden), they have nothing to pair with and are
    left out (counted, and said in a warning) rather than listed as unmatched.
    """
    g_recs, a_recs, dropped = _one_sided_collectives(g_recs, a_recs)
    step_results = _compare_step(g_recs, a_recs, g_store, a_store, plan)
    ctx = StepContext(
        results=step_results.results,
        profile=plan.prof,
        plan=plan,
        rank=r,
        step=s,
        pairs=step_results.pairs,  # type: ignore[arg-type]  # a sequence, read when used
        stores=(g_store, a_store),
        g_recs=g_recs,  # type: ignore[arg-type]
        a_recs=a_recs,  # type: ignore[arg-type]
        inputs=JudgeInputs(calibrated=_calibrated(plan, g_store, r, s, g_recs)),
        # no golden forward output is a router's top-k indices: no router to look for
        # among the pairs (which would read every forward pair into memory at once)
        routes=None
        if step_results.routers_possible
        else Routing((g_store, a_store), plan.prof, plan.tolerance_dtype, plan.computes),
    )
    step_results.results = RecordRows()  # the context's now (let go if re-measured)
    buffered = _counted(g_recs, "buffers") != 0
    names = {g.key: g.name for g in g_recs if g.role == "buffer"} if buffered else {}
    buffers = Explanations(buffer_names=names)
    # the rules in their phases; status, local and the why line of every record
    verdict = run_rules(ctx, buffers)
    logger.debug("step_compared", rank=r, step=s, records=len(verdict.results))
    return UnitResult(
        rank=r,
        step=s,
        results=verdict.results,
        golden_only=step_results.golden_only,
        actual_only=step_results.actual_only,
        candidates=verdict.candidates,
        fallback=verdict.fallback,
        collectives_dropped=dropped,
        one_sided=step_results.one_sided,
        left_out=step_results.left_out,
    )


def _calibrated(
    plan: ComparePlan, g_store: TensorStore, rank: int, step: int, g_recs: Sequence[Record]
) -> dict[str, tuple[float, float]]:
    """Per golden record key: (error, concentrated error) of the calibration run on it
    (measured for the expected-error judge only)."""
    if plan.calibration is None or plan.prof.rule != "expected":
        return {}
    cal = plan.calibration_records(rank)
    out: dict[str, tuple[float, float]] = {}
    c_store = TensorStore(plan.calibration.path)
    computes = (plan.computes[0], plan.calibration.manifest.compute_dtype)
    try:
        for g in g_recs:
            c = cal.get((step, g.key))
            if c is None or c.role == "param":
                continue
            m = pair_metrics(g, c, g_store, c_store, plan.prof, plan.tolerance_dtype, computes)
            if m.level not in ("full", "stats") or not math.isfinite(m.error):
                continue
            out[g.key] = measured_errors(m)
    finally:
        c_store.close()
    return out


def _counted(records: Sequence[Record], what: str) -> int | None:
    """How many records of a streamed step have ``what`` (StepRecords counts them as they
    are read), so that a step with none is not read again to learn it; None: not counted."""
    return getattr(records, what) if isinstance(records, StepRecords) else None


def _is_collective(rec: Record) -> bool:
    return rec.collective is not None and rec.module.startswith("dist.")


def _one_sided_collectives(
    g_recs: Sequence[Record], a_recs: Sequence[Record]
) -> tuple[Sequence[Record], Sequence[Record], tuple[int, int]]:
    if _counted(g_recs, "collectives") == _counted(a_recs, "collectives") == 0:
        return g_recs, a_recs, (0, 0)
    g_dist = sum(map(_is_collective, g_recs))
    a_dist = sum(map(_is_collective, a_recs))
    if g_dist and not a_dist:
        return [r for r in g_recs if not _is_collective(r)], a_recs, (g_dist, 0)
    if a_dist and not g_dist:
        return g_recs, [r for r in a_recs if not _is_collective(r)], (0, a_dist)
    return g_recs, a_recs, (0, 0)


def compare_shard(
    plan: ComparePlan,
    owns: Callable[[int, int], bool | None],
    on_unit: Callable[[int, int], None] | None = None,
) -> ShardResult:
    """Compare the units this process owns.

    ``owns(rank, step)`` says whether the unit is this process's; ``owns(rank, -1)``
    whether the rank's pairing warnings are (True), and None when the process owns
    nothing of that rank (its records are then not read at all). ``on_unit(rank,
    step)`` is called after each unit.
    """
    units: list[UnitResult] = []
    warned: dict[int, list[str]] = {}
    coverage = CoverageTracker(plan.g_run, plan.a_run, rank=plan.rank, step=plan.step)
    g_store, a_store = TensorStore(plan.g_run.path), TensorStore(plan.a_run.path)
    try:
        for r in plan.ranks:
            keeps_warnings = owns(r, -1)
            if keeps_warnings is None:
                continue
            warnings: list[str] = []
            for s, g_recs, a_recs in _paired_steps(plan.g_run, plan.a_run, r, plan.step, warnings):
                if not owns(r, s):
                    continue
                g_recs, a_recs = coverage.pair(r, s, g_recs, a_recs)
                units.append(compare_unit(plan, g_store, a_store, r, s, g_recs, a_recs))
                if on_unit is not None:
                    on_unit(r, s)
            if keeps_warnings and warnings:
                warned[r] = warnings
    finally:
        g_store.close()
        a_store.close()
    return ShardResult(units=units, warnings=warned, **coverage.tallies())


def merge_shards(plan: ComparePlan, shards: list[ShardResult]) -> Comparison:
    """Put the shards' units together in (rank, step) order and judge the whole comparison.

    The order is the one a single process compares in, so the result does not
    depend on how many processes shared the work.
    """
    g_run, a_run = plan.g_run, plan.a_run
    warnings = _shard_warnings(plan, shards)
    coverage = CoverageTracker(g_run, a_run, rank=plan.rank, step=plan.step)
    coverage.add(*shards)
    units = sorted((u for shard in shards for u in shard.units), key=lambda u: (u.rank, u.step))
    # a decoding divergence: from the step whose token ids part, each step reads other
    # tokens (and a cache built from them); its records differ because its data do, so
    # they are left out of the verdict, and the coverage says so (a partial match)
    parted = decoding_divergence(units)
    kept = [u for u in units if parted is None or u.step < parted.result.step]
    results = RecordRows()  # compact: memory per record pair stays small (docs/compare.md)
    for unit in kept:
        results.extend(unit.results)
    golden_only = [k for u in kept for k in u.golden_only]
    actual_only = [k for u in kept for k in u.actual_only]
    candidates = [c for u in kept for c in u.candidates]
    firsts = [u.first for u in kept if u.first is not None]
    counts = Counts.of(results)
    _check_comparable(plan, len(units), results, counts, golden_only, actual_only)
    # across ranks: a collective explained by another rank's wrong input is dropped
    candidates, firsts = decide_ranks(results.having(("fail", "nonfinite")), candidates, firsts)
    first = min(firsts, key=lambda c: c.order) if firsts else None
    warnings.extend(_unit_notes(units, golden_only, actual_only))
    prof = plan.prof
    return Comparison(
        golden=str(g_run.path),
        actual=str(a_run.path),
        devices=[g_run.manifest.device, a_run.manifest.device],
        dtypes=[g_run.manifest.dtype, a_run.manifest.dtype],
        compute_dtypes=list(plan.computes),
        tolerance_dtype=plan.tolerance_dtype,
        targets=[g_run.manifest.target, a_run.manifest.target],
        profile=prof.name,
        tolerances={k: v.model_dump() for k, v in prof.dtypes.items()}
        | {"amplification": prof.amplification},
        verdict="diverged" if counts.failed or counts.nonfinite else "match",
        first_divergence=first.divergence() if first is not None else None,
        suspects=rank_suspects(candidates, first, plan.options.suspects),
        further_findings=further_findings(candidates, first),
        counts=counts,
        records=results,
        unmatched=Unmatched(golden_only=golden_only, actual_only=actual_only),
        fingerprint_diff=fingerprint_diff(g_run.manifest.fingerprint, a_run.manifest.fingerprint),
        warnings=warnings,
        coverage=_decoding_gap(coverage.result(), parted, units),
    )


def _shard_warnings(plan: ComparePlan, shards: list[ShardResult]) -> list[str]:
    """The plan's warnings, then each rank's from whichever shard kept them."""
    return [
        *plan.warnings,
        *(w for r in plan.ranks for sh in shards for w in sh.warnings.get(r, [])),
    ]


def _check_comparable(
    plan: ComparePlan,
    steps_seen: int,
    results: RecordRows,
    counts: Counts,
    golden_only: list[str],
    actual_only: list[str],
) -> None:
    """Raise when nothing was compared, or too few records aligned for one model."""
    g_run, a_run = plan.g_run, plan.a_run
    if plan.step is not None and steps_seen == 0:
        raise UsageError(f"step {plan.step} is in neither recording (or in only one of them)")
    if steps_seen == 0:
        raise IncomparableRunsError(
            f"{g_run.path} and {a_run.path} share no step of any rank: nothing to compare"
            + incomplete_note(g_run, a_run)
        )
    matched = len(results) - counts.missing
    # another tool's extra detail (msprobe's API-level records, a namespace precguard never
    # records, docs/msprobe.md) is no evidence of a different model: only listed as unmatched
    unmatched_modules = max(
        sum(not plan.is_detail(k) for k in keys) for keys in (golden_only, actual_only)
    )
    if matched < MIN_ALIGNED_SHARE * unmatched_modules:
        truncated = hints.truncation_note(g_run, a_run, results, golden_only, actual_only)
        if truncated is not None:
            raise DumpFormatError(truncated)
        raise IncomparableRunsError(
            hints.not_the_same_model(
                g_run, a_run, matched, golden_only, actual_only, plan.is_detail
            )
        )


def _unit_notes(units: list[Any], golden_only: list[str], actual_only: list[str]) -> list[str]:
    """The warnings the units leave: collectives and inputs one side recorded, padding left
    out, records left unmatched."""
    notes = []
    for side, i in (("golden", 0), ("actual", 1)):
        dropped = sum(u.collectives_dropped[i] for u in units)
        if dropped:
            notes.append(hints.collectives_left_out(dropped, side))
    notes.extend(hints.one_sided_notes([o for u in units for o in u.one_sided]))
    padded = padding_note(sum((u.left_out for u in units), LeftOut()))
    if padded is not None:
        notes.append(padded)
    if golden_only or actual_only:
        notes.append(hints.unmatched_warning(golden_only, actual_only))
    return notes


def _decoding_gap(cov: Coverage, parted: Candidate | None, units: list[Any]) -> Coverage:
    """The coverage, with the steps after a decoding divergence as its first gap."""
    if parted is None:
        return cov
    later = sorted({u.step for u in units if u.step >= parted.result.step})
    span = f"step {later[0]}" if len(later) == 1 else f"steps {later[0]}-{later[-1]}"
    gap = f"{span} not judged: {parted.reason}"
    return cov.model_copy(update={"complete": False, "gaps": [gap, *cov.gaps]})


def fingerprint_diff(golden: dict[str, Any], actual: dict[str, Any]) -> dict[str, list[Any]]:
    """Keys whose values differ between two environment fingerprints: key -> [golden, actual]."""
    keys = sorted(set(golden) | set(actual))
    return {k: [golden.get(k), actual.get(k)] for k in keys if golden.get(k) != actual.get(k)}


def _check_models(g_run: Run, a_run: Run, *, renamed: bool = False) -> list[str]:
    warnings: list[str] = []
    gm, am = g_run.manifest, a_run.manifest
    wrapped = gm.model in WRAPPER_TYPES or am.model in WRAPPER_TYPES
    wrapped = wrapped or fsdp2_class(gm.model) == am.model or fsdp2_class(am.model) == gm.model
    differ = gm.model and am.model and gm.model != am.model and not wrapped
    if differ and not renamed:
        raise IncomparableRunsError(
            f"{a_run.path / 'manifest.json'}: recording of model {shown(repr(am.model))}, but "
            f"golden {g_run.path} recorded {shown(repr(gm.model))}"
        )
    if differ:
        warnings.append(
            f"model classes differ (golden {gm.model}, actual {am.model}); compared "
            "because --map rules were given"
        )
    return warnings  # an incomplete run is told first by the coverage (coverage.py)


def _ranks(g_run: Run, a_run: Run, rank: int | None, warnings: list[str]) -> list[int]:
    g_ranks, a_ranks = set(g_run.ranks), set(a_run.ranks)
    if rank is not None:
        for run, ranks in ((g_run, g_ranks), (a_run, a_ranks)):
            if rank not in ranks:
                raise UsageError(
                    f"{run.path}: has no rank {rank} (ranks: {sorted(ranks) or 'none'})"
                )
        return [rank]
    common = sorted(g_ranks & a_ranks)
    if not common:
        for run, ranks in ((g_run, g_ranks), (a_run, a_ranks)):
            if not ranks:
                raise DumpFormatError(f"{run.path}: no rank*/records.jsonl found; empty recording")
        raise IncomparableRunsError(
            f"the recordings share no rank: golden has {sorted(g_ranks)}, actual {sorted(a_ranks)}"
        )
    if g_ranks != a_ranks:
        warnings.append(
            f"ranks differ (golden {sorted(g_ranks)}, actual {sorted(a_ranks)}); comparing {common}"
        )
    return common


def _steps(run: Run, rank: int, only: int | None) -> Iterator[tuple[int, StepRecords]]:
    for records in run.steps(rank):  # each step kept as where its records lie in the file
        s = records.step
        if only is None or s == only:
            yield s, records
        elif s > only:
            return


def _paired_steps(
    g_run: Run, a_run: Run, rank: int, only: int | None, warnings: list[str]
) -> Iterator[tuple[int, StepRecords, StepRecords]]:
    """Yield (step, golden records, actual records) for steps both recorded, in order."""
    g_iter, a_iter = _steps(g_run, rank, only), _steps(a_run, rank, only)
    g_next, a_next = next(g_iter, None), next(a_iter, None)
    while g_next is not None and a_next is not None:
        if g_next[0] == a_next[0]:
            yield g_next[0], g_next[1], a_next[1]
            g_next, a_next = next(g_iter, None), next(a_iter, None)
        elif g_next[0] < a_next[0]:
            warnings.append(f"rank {rank} step {g_next[0]}: only in golden")
            g_next = next(g_iter, None)
        else:
            warnings.append(f"rank {rank} step {a_next[0]}: only in actual")
            a_next = next(a_iter, None)
    for rest, side in ((g_next, "golden"), (a_next, "actual")):
        if rest is not None:
            warnings.append(f"rank {rank}: steps from {rest[0]} on are only in {side}")


@dataclass
class _StepResults:
    #: every record measured (or missing), each kept as a compact row
    results: RecordRows = field(default_factory=RecordRows)
    golden_only: list[str] = field(default_factory=list)
    actual_only: list[str] = field(default_factory=list)
    one_sided: list[OneSided] = field(default_factory=list)
    #: the aligned (golden, actual) record pairs, for the routing rules (routing.py)
    pairs: Sequence[tuple[Record, Record]] = ()
    #: the padded positions left out of the metrics (padding.py)
    left_out: LeftOut = field(default_factory=LeftOut)
    #: whether a golden forward output could be a router's top-k indices (routing.py)
    routers_possible: bool = True


def _compare_step(
    g_recs: Sequence[Record],
    a_recs: Sequence[Record],
    g_store: TensorStore,
    a_store: TensorStore,
    plan: ComparePlan,
) -> _StepResults:
    in_order = _compare_in_order(g_recs, a_recs, g_store, a_store, plan)
    if in_order is not None:
        return in_order
    g_recs, a_recs = list(g_recs), list(a_recs)  # aligned as a whole: read into memory
    out = _StepResults()
    g_store.validate(g_recs)  # a tensor file must agree with its record, read or not
    a_store.validate(a_recs)
    alignment = align(g_recs, a_recs, plan.renamer)
    out.pairs = list(alignment.pairs)
    padding = StepPadding.of_step(g_recs, a_recs, g_store, a_store)
    results = []
    for g, a in alignment.pairs:
        metrics = pair_metrics(
            g, a, g_store, a_store, plan.prof, plan.tolerance_dtype, plan.computes, padding
        )
        # "pass" until the one pass settles it (compare/verdict.py writes every measured
        # record's status, once): engine only measures
        results.append(_result(g, a, "pass", metrics))
    out.left_out = padding.left_out()
    out.golden_only = [g.key for g in alignment.golden_only]
    out.actual_only = [a.key for a in alignment.actual_only]
    # one-sided inputs and outputs are counted missing, told apart in a note
    out.one_sided = [OneSided.of(side, rec) for side, rec in alignment.one_sided]
    one_sided = [rec for _, rec in alignment.one_sided]
    for rec in [*alignment.golden_only, *alignment.actual_only, *one_sided]:
        results.append(_result(rec, None, "missing", None))
    out.results = RecordRows(sorted(results, key=lambda x: (x.seq, x.status == "missing")))
    return out


def _compare_in_order(
    g_recs: Sequence[Record],
    a_recs: Sequence[Record],
    g_store: TensorStore,
    a_store: TensorStore,
    plan: ComparePlan,
) -> _StepResults | None:
    """The step measured as it streams, when both sides recorded the same records in the
    same order (each key once): the i-th golden record pairs with the i-th actual one, as
    :func:`~precguard.compare.align.align` would pair them, and neither side's records are
    ever all in memory (docs/compare.md, "Memory"). None when the step needs aligning."""
    if not (isinstance(g_recs, StepRecords) and isinstance(a_recs, StepRecords)):
        return None
    if plan.renamer.rules or not g_recs.names_like(a_recs):
        return None
    out = _StepResults()
    for recs, store in ((g_recs, g_store), (a_recs, a_store)):
        if recs.tensors:  # a tensor file must agree with its record, read or not
            store.validate(recs)
    # the padding masks are the root's forward inputs: only those are read
    padding = StepPadding.of_step(g_recs.forward_roots(), a_recs.forward_roots(), g_store, a_store)
    routers = False
    for g, a in zip(g_recs, a_recs, strict=True):
        if not pairs_in_order(g, a):  # a hash agreed where names do not, or a wrapper
            return None
        routers = routers or (
            g.phase == "forward"
            and g.role == "output"
            and is_index_dtype(g.dtype)
            and len(g.shape) >= 2
        )
        metrics = pair_metrics(
            g, a, g_store, a_store, plan.prof, plan.tolerance_dtype, plan.computes, padding
        )
        out.results.append(_result(g, a, "pass", metrics))  # settled by the one pass
    out.left_out = padding.left_out()
    out.pairs = InOrder(g_recs, a_recs)
    out.routers_possible = routers
    return out


def _result(g: Record, a: Record | None, status: Status, metrics: Metrics | None) -> RecordResult:
    return RecordResult(
        **{name: getattr(g, name) for name in (*RecordIdentity.model_fields, "seq")},
        actual_key=a.key if a is not None and a.key != g.key else None,
        golden_dtype=g.dtype,
        actual_dtype=a.dtype if a is not None else None,
        shape=list(g.shape),
        actual_shape=list(a.shape) if a is not None and list(a.shape) != list(g.shape) else None,
        status=status,
        metrics=metrics,
    )


def pair_metrics(
    g: Record,
    a: Record,
    g_store: TensorStore,
    a_store: TensorStore,
    profile: Profile,
    tol_mode: str = "auto",
    computes: tuple[str | None, str | None] = (None, None),
    padding: StepPadding | None = None,
) -> Metrics:
    """Metrics for one aligned pair: full tensors when both were saved, else statistics.

    Each side's precision is the less precise of its stored dtype and the dtype it
    was computed in (the record's ``compute_dtype``, else its run's, ``computes``).
    ``padding``, the step's padded positions, leaves them out of the metrics
    (:mod:`precguard.compare.padding`).
    """
    g_prec = precision(g.dtype, g.compute_dtype or computes[0])
    a_prec = precision(a.dtype, a.compute_dtype or computes[1])
    dtype = tolerance_dtype(g_prec, a_prec, tol_mode)
    if g.role == "param" and g.shape != a.shape:
        raise IncomparableRunsError(
            f"{rank_dir(a_store.root, a.rank) / RECORDS_FILE}: a recording of a different "
            f"model: parameter {g.key} ({g.name}) has shape {a.shape}, golden {g.shape}"
            + hints.shard_hint(g.shape, a.shape)
        )
    padding = padding if padding is not None else StepPadding([], [])
    if _squeezed(g.shape) != _squeezed(a.shape):
        return UnmeasuredMetrics(
            level="none",
            dtype=dtype,
            error=math.inf,
            note=f"shapes differ: golden {g.shape}, actual {a.shape}",
        )
    if g.tensor is not None and a.tensor is not None:
        gt, at = g_store.tensor(g), a_store.tensor(a)
        g_release = g_store.releaser(g, gt.element_size())
        a_release = a_store.releaser(a, at.element_size())

        def release(start: int, end: int) -> None:
            g_release(start, end)
            a_release(start, end)

        as_masks = mask_metrics(g, a, gt, at, padding)
        if as_masks is not None:
            return as_masks
        kept = padding.full(g, a, gt, at)
        rms = golden_rms(g.stats)
        releaser: Callable[[int, int], None] | None = release
        if kept is not None:  # copies, their rms the real positions' (zeros count in it)
            (gt, at), rms, releaser = kept, None, None
        metrics = tensor_metrics(
            gt,
            at,
            golden_dtype=g_prec,
            actual_dtype=a_prec,
            profile=profile,
            tol_mode=tol_mode,
            golden_rms=rms,
            release=releaser,
        )
        return with_bias(metrics, profile)
    as_masks = mask_stats_metrics(g, a)
    if as_masks is not None:
        return as_masks
    return padding.stats(g, a, lambda g, a: stats_metrics(g, a, dtype=dtype))


def _squeezed(shape: list[int]) -> list[int]:
    """The shape without size-1 dimensions: [1, 32, 16] and [32, 16] hold the same layout."""
    return [s for s in shape if s != 1]
