"""``compare --layout``: the layout branch of compare, above it.

:func:`compare_layout` gathers each many-rank side into a one-rank view
(:class:`~precguard.layout.view.LayoutViews`), has
:func:`precguard.compare.compare_recordings` compare the views as it compares any
recordings, and maps the result back onto the real recordings and ranks.
:func:`precguard.compare_runs` (defined in :mod:`precguard.compare.runs`) calls
:func:`compare_layout` when given ``layout=``: this module installs it on import.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from precguard.compare.options import CompareOptions, compare_options
from precguard.compare.report import Comparison
from precguard.compare.runs import (
    compare_recordings,
    compare_runs,
    named,
    open_side,
    set_layout_branch,
    with_names,
)
from precguard.dump.reader import Run
from precguard.errors import PrecguardError, UsageError
from precguard.layout.spec import LayoutSpec
from precguard.layout.view import LayoutViews

__all__ = ["compare_layout", "compare_runs"]


def compare_layout(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    layout: str | Path | LayoutSpec,
    options: CompareOptions | None = None,
    *,
    on_step: Callable[[int, int], None] | None = None,
    **settings: Any,
) -> Comparison:
    """Compare with the shards of a tensor-/pipeline-parallel side gathered by ``layout``.

    ``layout`` is a layout spec (YAML file, shipped name or :class:`LayoutSpec`, see
    docs/layouts.md); the first divergence names the rank whose shard holds the
    error. ``options`` and the keyword ``settings`` are those of
    :func:`precguard.compare.compare_recordings`; ``rank`` cannot be given (the ranks are
    gathered), nor ``calibration`` when the golden itself is gathered.
    """
    options = compare_options(options, **settings)
    if options.rank is not None:
        raise UsageError("--rank cannot be used with --layout (the ranks are gathered)")
    g, a = open_side(golden), open_side(actual)
    views = LayoutViews(g.run, a.run, layout)
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


# compare_runs(layout=...) comes here; precguard.compare_runs is reached through this module
set_layout_branch(compare_layout)
