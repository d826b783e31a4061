"""``compare_runs``: compare two recordings, on one process or many.

The top of the compare package: it settles a plan (:mod:`precguard.compare.engine`),
has its (rank, step) units compared here, by worker processes or by the processes
of a torchrun job (:mod:`precguard.compare.parallel`), and merges them; a
tensor-/pipeline-parallel side is first gathered into whole tensors
(:mod:`precguard.layout`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from precguard.compare import parallel
from precguard.compare.engine import ComparePlan, merge_shards, plan_comparison
from precguard.compare.options import CompareOptions, compare_options
from precguard.compare.report import Comparison
from precguard.dump.reader import Run, load_run
from precguard.errors import PrecguardError, UsageError


def compare_runs(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    options: CompareOptions | None = None,
    *,
    on_step: Callable[[int, int], None] | None = None,
    layout: Any = None,
    **settings: Any,
) -> Comparison:
    """Compare an ``actual`` recording with a ``golden`` one and name where they diverge.

    How to compare is a :class:`~precguard.compare.options.CompareOptions`: pass one
    as ``options``, or its fields as keyword arguments (they build it; with both, the
    keywords win), e.g. ``compare_runs(g, a, profile="strict", step=0)``:

    ``profile`` (name or Profile), ``rtol``, ``atol``, ``rank``, ``step``,
    ``suspects``, ``tolerance_dtype``, ``rename``, ``workers``, ``calibration``;
    see :class:`~precguard.compare.options.CompareOptions` for what each means.
    An unknown keyword is pydantic's ``ValidationError`` naming it.

    :param on_step: called as ``on_step(rank, step)`` after each step is compared
        (the CLI's progress bar).
    :param layout: a layout spec (YAML file, shipped name or LayoutSpec, see
        docs/layouts.md): the shards of a tensor-/pipeline-parallel side are gathered
        into whole tensors, and the first divergence names the rank whose shard holds
        the error.
    :raises IncomparableRunsError: the recordings are of different models.
    :raises DumpFormatError: a recording is missing, corrupt or of a newer schema.

    >>> result = precguard.compare_runs("runs/cpu", "runs/npu")      # doctest: +SKIP
    >>> result.verdict, result.first_divergence.module          # doctest: +SKIP
    ('diverged', 'model.layers.3.mlp')
    """
    options = compare_options(options, **settings)
    if layout is not None:  # gather the parallel side(s) into one rank: precguard.layout
        from precguard.layout.view import LayoutViews

        if options.rank is not None:
            raise UsageError("--rank cannot be used with --layout (the ranks are gathered)")
        g_run = golden if isinstance(golden, Run) else load_run(golden)
        a_run = actual if isinstance(actual, Run) else load_run(actual)
        views = LayoutViews(g_run, a_run, layout)
        try:
            if views.g is not None and options.calibration is not None:
                raise UsageError(
                    "--calibration cannot be used with --layout when the golden is gathered: "
                    "the calibration recording is of one device, the golden's ranks are not"
                )
            result = compare_runs(views.golden, views.actual, options, on_step=on_step)
            return views.finish(result, options.resolved_profile(), options.tolerance_dtype)
        except PrecguardError as exc:  # name the recordings, not the gathered views
            raise type(exc)(views.real_paths(str(exc))) from exc
        finally:
            views.close()

    def make_plan() -> ComparePlan:
        return plan_comparison(golden, actual, options)

    if parallel.job_active():
        plan, shards = parallel.compare_in_job(make_plan)
    else:
        plan = make_plan()
        shards = parallel.compare_shards(plan, on_step=on_step)
    return merge_shards(plan, shards)
