"""``compare_recordings``: compare two recordings (or msprobe dumps), on one process or many.

It opens both sides, settles a plan (:mod:`precguard.compare.engine`), has the (rank, step)
units compared (:mod:`precguard.compare.parallel`) and merges them. ``layout=`` (a sharded
side gathered first) is taken by the layer above, :mod:`precguard.layout.compare`.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from precguard.compare import parallel
from precguard.compare.advice import swapped_sides
from precguard.compare.engine import ComparePlan, merge_shards, plan_comparison
from precguard.compare.options import CompareOptions, compare_options
from precguard.compare.report import Comparison
from precguard.dump.reader import Run
from precguard.errors import PrecguardError, UsageError
from precguard.interop.msprobe import is_api_key, open_recording

_Result = TypeVar("_Result", bound=BaseModel)


@dataclass(frozen=True)
class OpenedRecording:
    """A recording opened to be compared, and the name the user gave it.

    (Not :class:`precguard.Side`, which says what runs where before anything is recorded.)
    """

    run: Run
    name: str

    @property
    def converted(self) -> bool:
        """Whether ``run`` is a temporary recording converted from an msprobe dump."""
        return self.name != str(self.run.path)


def open_side(side: str | os.PathLike[str] | Run) -> OpenedRecording:
    """``side`` as a recording: a Run as is, a recording directory loaded, an msprobe dump
    converted into a temporary recording (docs/msprobe.md). The CLI opens with it too.

    :raises DumpFormatError: ``side`` is neither a readable recording nor an msprobe dump.
    """
    if isinstance(side, Run):
        return OpenedRecording(side, str(side.path))
    return OpenedRecording(open_recording(side), str(Path(side)))


def named(text: str, *sides: OpenedRecording) -> str:
    """``text`` with each converted side's temporary path replaced by the dump's name."""
    for side in sides:
        if side.converted:
            text = text.replace(str(side.run.path), f"{side.name} (msprobe dump)")
    return text


def with_names(result: _Result, golden: OpenedRecording, actual: OpenedRecording) -> _Result:
    """``result`` (a Comparison or a bitwise one) naming the directories the user gave,
    not a converted dump's temporary copy."""
    if not (golden.converted or actual.converted):
        return result
    return result.model_copy(update={"golden": golden.name, "actual": actual.name})


def compare_recordings(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    options: CompareOptions | None = None,
    *,
    on_step: Callable[[int, int], None] | None = None,
    **settings: Any,
) -> Comparison:
    """Compare an ``actual`` recording with a ``golden`` one and name where they diverge.

    Either side may be a precguard recording (a directory or a
    :class:`~precguard.dump.reader.Run`) or an msprobe dump directory, converted
    on the fly (docs/msprobe.md); the result names the directories given.

    How to compare is a :class:`~precguard.compare.options.CompareOptions`: pass one
    as ``options``, or its fields as keyword arguments (the keywords win; an unknown
    one is a ``ValidationError`` naming it). A sharded recording is compared by
    :func:`precguard.compare_runs` with ``layout=``, which calls this.

    :param on_step: called as ``on_step(rank, step)`` after each step is compared
        (the CLI's progress bar).
    :raises IncomparableRunsError: the recordings are of different models.
    :raises DumpFormatError: a recording is missing, corrupt or of a newer schema.

    >>> result = precguard.compare_runs("runs/cpu", "runs/npu")      # doctest: +SKIP
    >>> result.verdict, result.first_divergence.module          # doctest: +SKIP
    ('diverged', 'model.layers.3.mlp')
    """
    if "layout" in settings:
        raise UsageError(
            "layout= is taken by precguard.compare_runs; "
            "precguard.compare.compare_recordings compares the recordings as they are"
        )
    options = compare_options(options, **settings)
    return compare_opened(open_side(golden), open_side(actual), options, on_step=on_step)


def compare_opened(
    g: OpenedRecording,
    a: OpenedRecording,
    options: CompareOptions,
    *,
    on_step: Callable[[int, int], None] | None = None,
) -> Comparison:
    """Compare two opened recordings (:func:`open_side`), naming them as the user did."""
    try:
        result = _compare(g.run, a.run, options, on_step)
    except PrecguardError as exc:
        message = named(str(exc), g, a)
        if message == str(exc):
            raise
        raise type(exc)(message) from exc
    swapped = swapped_sides(result.devices, result.dtypes)
    if swapped is not None:  # first: the advice would come out inverted
        result = result.model_copy(update={"warnings": [swapped, *result.warnings]})
    return with_names(result, g, a)


def compare_runs(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    options: CompareOptions | None = None,
    *,
    layout: object = None,
    on_step: Callable[[int, int], None] | None = None,
    **settings: Any,
) -> Comparison:
    """:func:`compare_recordings`; ``layout=`` (a sharded side gathered first,
    docs/layouts.md) is taken by ``precguard.compare_runs`` (:mod:`precguard.layout.compare`):
    compare, below the layout package, cannot gather, and says so."""
    if layout is not None:
        raise UsageError(
            "layout= gathers through precguard.layout: call precguard.compare_runs "
            "(precguard.layout.compare.compare_runs)"
        )
    return compare_recordings(golden, actual, options, on_step=on_step, **settings)


def _compare(
    golden: Run,
    actual: Run,
    options: CompareOptions,
    on_step: Callable[[int, int], None] | None,
) -> Comparison:
    def make_plan() -> ComparePlan:
        plan = plan_comparison(golden, actual, options)
        plan.is_detail = is_api_key  # msprobe's API-level records: detail, not a model's
        return plan

    if parallel.job_active():
        plan, shards = parallel.compare_in_job(make_plan)
    else:
        plan = make_plan()
        shards = parallel.compare_shards(plan, on_step=on_step)
    return merge_shards(plan, shards)
