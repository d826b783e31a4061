"""``job``: the one compare job the API and the CLI both run.

Both sides are opened once; a sharded side is gathered by a strategy passed in from the
layer above (:func:`precguard.layout.compare.gathered`); the CLI's ``--replay`` and
``--target``/``--verify`` (in ``localize/``) are ``then`` steps.

>>> from precguard.compare import CompareOptions                   # doctest: +SKIP
>>> result = job(CompareOptions(), "runs/cpu", "runs/npu")          # doctest: +SKIP
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol

from precguard.compare.coverage import last_step
from precguard.compare.options import CompareOptions
from precguard.compare.report import Comparison
from precguard.compare.runs import OpenedRecording, compare_opened, open_side
from precguard.dump.reader import Run

Side = str | os.PathLike[str] | Run
OnStep = Callable[[int, int], None]


class Gather(Protocol):
    """How to compare two opened recordings when one side is sharded (``--layout``)."""

    def __call__(
        self,
        golden: OpenedRecording,
        actual: OpenedRecording,
        options: CompareOptions,
        *,
        on_step: OnStep | None = None,
    ) -> Comparison:
        """Compare ``actual`` with ``golden``, its shards gathered first."""
        ...


def steps_in_scope(run: Run, options: CompareOptions) -> int | None:
    """How many (rank, step) units of ``run`` the options compare (None: unknown)."""
    total = 0
    for r in run.ranks if options.rank is None else [options.rank]:
        last = last_step(run, r)
        if last is not None:
            total += 1 if options.step is not None else last + 1
    return total or None


def job(
    options: CompareOptions,
    golden: Side,
    actual: Side,
    *,
    gather: Gather | None = None,
    on_step: OnStep | None = None,
    on_total: Callable[[int | None], None] | None = None,
    then: Sequence[Callable[[Comparison], Comparison]] = (),
) -> Comparison:
    """Compare ``actual`` with ``golden`` as ``options`` say, then run each ``then`` step.

    :param gather: the strategy for a sharded side (``--layout``); None: compare as is.
    :param on_step: called as ``on_step(rank, step)`` after each unit is compared.
    :param on_total: called once, before comparing, with the number of units in scope
        (from the golden as it was opened for the comparison: it is read once).
    :param then: steps applied to the result in order (replay, impact, verify).
    """
    g, a = open_side(golden), open_side(actual)
    if on_total is not None:
        on_total(steps_in_scope(g.run, options))
    compare = compare_opened if gather is None else gather
    result = compare(g, a, options, on_step=on_step)
    for step in then:
        result = step(result)
    return result
