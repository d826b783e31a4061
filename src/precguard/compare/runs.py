"""``compare_runs``: compare two recordings, on one process or many.

The top of the compare package: it settles a plan (:mod:`precguard.compare.engine`),
has its (rank, step) units compared here, by worker processes or by the processes
of a torchrun job (:mod:`precguard.compare.parallel`), and merges them; a
tensor-/pipeline-parallel side is first gathered into whole tensors
(:mod:`precguard.layout`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence

from precguard.compare import parallel
from precguard.compare.engine import (
    _DTYPE_ALIASES,
    ComparePlan,
    merge_shards,
    plan_comparison,
)
from precguard.compare.report import Comparison
from precguard.compare.tolerance import Profile, get_profile
from precguard.dump.reader import Run, load_run
from precguard.errors import PrecguardError, UsageError


def compare_runs(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    *,
    profile: str | Profile = "default",
    rtol: float | None = None,
    atol: float | None = None,
    rank: int | None = None,
    step: int | None = None,
    suspects: int | None = None,
    tolerance_dtype: str = "auto",
    on_step: Callable[[int, int], None] | None = None,
    rename: Sequence[str] = (),
    layout: str | os.PathLike[str] | None = None,
    workers: int = 1,
    calibration: str | os.PathLike[str] | None = None,
) -> Comparison:
    """Compare an ``actual`` recording with a ``golden`` one and name where they diverge.

    :param profile: tolerance profile name (``default``, ``strict``, ``msprobe``) or object.
    :param rtol: override the profile's relative tolerance for every dtype
        (``rel_l2`` keeps its ratio to ``rtol``).
    :param atol: override the absolute tolerance.
    :param rank: compare only this rank (default: every rank both recorded).
    :param step: compare only this step (default: every step).
    :param suspects: how many further suspects to list (default: every module call
        with a local error of its own).
    :param tolerance_dtype: ``"auto"`` (default; ``"actual"`` is the same): judge each
        pair by the less precise of the two sides' compute precisions (a bf16 run, or an
        ``emu:bf16`` run stored as float32, is judged as bf16); ``"golden"``: by the
        golden's (a bf16 run must match an fp32 golden to fp32 tolerances); a float
        dtype name: by that dtype.
    :param on_step: called as ``on_step(rank, step)`` after each step is compared
        (the CLI's progress bar).
    :param rename: ``OLD=NEW`` module rename rules (globs), applied to both sides after
        wrapper prefixes (DDP, FSDP, torch.compile, checkpointing) are stripped.
    :param layout: a layout spec (YAML file or shipped name, see docs/layouts.md): the
        shards of a tensor-/pipeline-parallel side are gathered into whole tensors, and
        the first divergence names the rank whose shard holds the error.
    :param workers: processes that compare (rank, step) units in parallel; the result
        is the same as with one (see :mod:`precguard.compare.parallel`). Under
        ``torchrun -m precguard.compare`` the job's processes share the units instead.
    :param calibration: a second golden recording of the same code at the golden's
        precision, every module's inputs perturbed by one unit roundoff of the actual's
        (TTrace's calibration pass, :func:`precguard.compare.calibrate.perturb_inputs`):
        each record's error there is its sensitivity to that rounding on this model, and
        raises its expected error where the analytic model is too low (docs/compare.md).
    :raises IncomparableRunsError: the recordings are of different models.
    :raises DumpFormatError: a recording is missing, corrupt or of a newer schema.

    >>> result = precguard.compare_runs("runs/cpu", "runs/npu")      # doctest: +SKIP
    >>> result.verdict, result.first_divergence.module          # doctest: +SKIP
    ('diverged', 'model.layers.3.mlp')
    """
    if layout is not None:  # gather the parallel side(s) into one rank: precguard.layout
        from precguard.layout.view import LayoutViews

        if rank is not None:
            raise UsageError("--rank cannot be used with --layout (the ranks are gathered)")
        g_run = golden if isinstance(golden, Run) else load_run(golden)
        a_run = actual if isinstance(actual, Run) else load_run(actual)
        views = LayoutViews(g_run, a_run, layout)
        try:
            result = compare_runs(
                views.golden, views.actual, profile=profile, rtol=rtol, atol=atol, step=step,
                suspects=suspects, tolerance_dtype=tolerance_dtype, on_step=on_step,
                rename=rename, workers=workers,
            )  # fmt: skip
            prof = get_profile(profile) if isinstance(profile, str) else profile
            tol_mode = _DTYPE_ALIASES.get(tolerance_dtype, tolerance_dtype)
            return views.finish(result, prof.with_overrides(rtol, atol), tol_mode)
        except PrecguardError as exc:  # name the recordings, not the gathered views
            raise type(exc)(views.real_paths(str(exc))) from exc
        finally:
            views.close()

    def make_plan() -> ComparePlan:
        return plan_comparison(
            golden,
            actual,
            profile=profile,
            rtol=rtol,
            atol=atol,
            rank=rank,
            step=step,
            tolerance_dtype=tolerance_dtype,
            rename=rename,
            calibration=calibration,
        )

    if parallel.job_active():
        plan, shards = parallel.compare_in_job(make_plan)
    else:
        plan = make_plan()
        shards = parallel.compare_shards(plan, workers, on_step=on_step)
    return merge_shards(plan, shards, suspects=suspects)
