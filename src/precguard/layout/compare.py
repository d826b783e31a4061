"""``compare --layout``: the layout branch of compare, above it, passed in as a strategy.

:func:`gathered` is the strategy :func:`precguard.compare.job` takes for a
sharded side: it gathers each many-rank side into a one-rank view
(:class:`~precguard.layout.view.LayoutViews`), has compare compare the views as
it compares any recordings, and maps the result back onto the real recordings
and ranks. :func:`compare_runs` is the public ``precguard.compare_runs``: the
compare job, with ``layout=`` the gathering passed to it. Nothing is installed
into compare on import.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from precguard.compare.jobs import Gather, job
from precguard.compare.options import CompareOptions, compare_options
from precguard.compare.report import Comparison
from precguard.compare.runs import OpenedRecording, compare_recordings, named, with_names
from precguard.dump.reader import Run
from precguard.errors import PrecguardError, UsageError
from precguard.layout.spec import LayoutSpec
from precguard.layout.view import LayoutViews

__all__ = ["compare_layout", "compare_runs", "gathered"]


def gathered(layout: str | os.PathLike[str] | LayoutSpec) -> Gather:
    """The strategy that compares two opened recordings with ``layout``'s shards gathered.

    ``layout`` is a layout spec (YAML file, shipped name or :class:`LayoutSpec`, see
    docs/layouts.md); the first divergence names the rank whose shard holds the error.
    ``rank`` cannot be given (the ranks are gathered), nor ``calibration`` when the
    golden itself is gathered.
    """

    def gather(
        g: OpenedRecording,
        a: OpenedRecording,
        options: CompareOptions,
        *,
        on_step: Callable[[int, int], None] | None = None,
    ) -> Comparison:
        if options.rank is not None:
            raise UsageError("--rank cannot be used with --layout (the ranks are gathered)")
        views = LayoutViews(g.run, a.run, layout if isinstance(layout, LayoutSpec) else str(layout))
        try:
            if views.g is not None and options.calibration is not None:
                raise UsageError(
                    "--calibration cannot be used with --layout when the golden is gathered: "
                    "the calibration recording is of one device, the golden's ranks are not"
                )
            result = compare_recordings(views.golden, views.actual, options, on_step=on_step)
            result = views.finish(result, options.resolved_profile(), options.tolerance_dtype)
        except PrecguardError as exc:  # name the recordings, not the gathered views
            raise type(exc)(named(views.real_paths(str(exc)), g, a)) from exc
        finally:
            views.close()
        return with_names(result, g, a)

    return gather


def compare_layout(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    layout: str | Path | LayoutSpec,
    options: CompareOptions | None = None,
    *,
    on_step: Callable[[int, int], None] | None = None,
    **settings: Any,
) -> Comparison:
    """Compare with the shards of a tensor-/pipeline-parallel side gathered by ``layout``
    (:func:`gathered`); ``options`` and the keyword ``settings`` are those of
    :func:`precguard.compare.compare_recordings`."""
    options = compare_options(options, **settings)
    return job(options, golden, actual, gather=gathered(layout), on_step=on_step)


def compare_runs(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    options: CompareOptions | None = None,
    *,
    layout: str | os.PathLike[str] | LayoutSpec | None = None,
    on_step: Callable[[int, int], None] | None = None,
    **settings: Any,
) -> Comparison:
    """Compare an ``actual`` recording with a ``golden`` one and name where they diverge.

    ``precguard.compare_runs``: the compare job (:func:`precguard.compare.job`) on
    recordings or msprobe dumps; ``options`` or its keyword ``settings`` (``profile``,
    ``rtol``, ``atol``, ``rank``, ``step``, ``suspects``, ``tolerance_dtype``,
    ``rename``, ``workers``, ``calibration``, see
    :class:`~precguard.compare.options.CompareOptions`); with ``layout`` (a layout spec:
    YAML file, shipped name or ``LayoutSpec``) a tensor-/pipeline-parallel side
    gathered first (docs/layouts.md).

    :param on_step: called as ``on_step(rank, step)`` after each step is compared.
    :raises IncomparableRunsError: the recordings are of different models.
    :raises DumpFormatError: a recording is missing, corrupt or of a newer schema.

    >>> result = precguard.compare_runs("runs/cpu", "runs/npu")      # doctest: +SKIP
    >>> result.verdict, result.first_divergence.module          # doctest: +SKIP
    ('diverged', 'model.layers.3.mlp')
    """
    options = compare_options(options, **settings)
    strategy = gathered(layout) if layout is not None else None
    return job(options, golden, actual, gather=strategy, on_step=on_step)
