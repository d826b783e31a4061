"""Bitwise comparison of two recordings by their tensor hashes (``precguard bitwise``).

No tolerance: the first record in the golden's execution order whose ``hash``, dtype or
shape differs names the first tensor that stopped being reproducible (docs/watch.md,
"Bitwise determinism by hashes").
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from precguard.dump.reader import Run, load_run
from precguard.dump.schema import Record
from precguard.errors import ExitCode

#: differences listed in full after the first
MAX_LISTED = 50

_FROZEN = ConfigDict(frozen=True)

Reason = Literal["hash", "dtype", "shape", "golden_only", "actual_only"]


class BitwiseDifference(BaseModel):
    """One record whose bits differ between the runs (or that one run lacks)."""

    model_config = _FROZEN

    key: str = Field(description="The record key.")
    module: str = Field(description="Qualified module name.")
    module_type: str = Field(description="Class name of the module.")
    step: int = Field(description="Step of the record.")
    rank: int = Field(description="Rank of the record.")
    reason: Reason = Field(
        description="'hash': same dtype and shape, different bits; 'dtype'/'shape': those "
        "differ; 'golden_only'/'actual_only': one run has no such record."
    )
    golden_hash: str | None = Field(default=None, description="The golden's hash.")
    actual_hash: str | None = Field(default=None, description="The actual run's hash.")


class BitwiseComparison(BaseModel):
    """Result of :func:`compare_bitwise`."""

    model_config = _FROZEN

    schema_version: int = Field(default=1, description="Format version of this result.")
    golden: str = Field(description="Golden recording directory.")
    actual: str = Field(description="Recording under test.")
    verdict: Literal["identical", "differs", "inconclusive"] = Field(
        description="identical: every record paired, hashed and equal; differs: some record "
        "differs or exists on one side only; inconclusive: records without hashes."
    )
    compared: int = Field(description="Pairs whose hashes were compared.")
    equal: int = Field(description="Pairs with equal hashes.")
    unhashed: int = Field(description="Records (either side) that carry no hash.")
    first_difference: BitwiseDifference | None = Field(
        default=None, description="The first difference in the golden's execution order."
    )
    differences: list[BitwiseDifference] = Field(
        default_factory=list, description=f"Differences in execution order (at most {MAX_LISTED})."
    )
    total_differences: int = Field(default=0, description="All differences, listed or not.")

    @property
    def exit_code(self) -> int:
        """0 identical, 1 differs, 3 inconclusive."""
        codes = {"identical": ExitCode.PASS, "differs": ExitCode.FAIL}
        return codes.get(self.verdict, ExitCode.INCONCLUSIVE)


_Slot = tuple[int, int, str, int]  # rank, step, key, occurrence in that step


def _slots(run: Run, rank: int | None, step: int | None) -> Iterator[tuple[_Slot, Record]]:
    """Records of ``run`` in execution order, each with its pairing slot."""
    for r in run.ranks if rank is None else [rank]:
        seen: dict[tuple[int, str], int] = {}
        for rec in run.records(r):
            if step is not None and rec.step != step:
                continue
            n = seen.get((rec.step, rec.key), 0)
            seen[(rec.step, rec.key)] = n + 1
            yield (r, rec.step, rec.key, n), rec


def _difference(reason: Reason, rec: Record, g: str | None, a: str | None) -> BitwiseDifference:
    named = rec.model_dump(include={"key", "module", "module_type", "step", "rank"})
    return BitwiseDifference(**named, reason=reason, golden_hash=g, actual_hash=a)


def compare_bitwise(
    golden: str | os.PathLike[str] | Run,
    actual: str | os.PathLike[str] | Run,
    *,
    rank: int | None = None,
    step: int | None = None,
) -> BitwiseComparison:
    """Compare two recordings made with ``hashes=True`` by their hashes.

    :param rank: compare only this rank; :param step: only this step.
    :returns: a :class:`BitwiseComparison` naming the first tensor that differs.

    >>> result = compare_bitwise("runs/a", "runs/b")   # doctest: +SKIP
    >>> result.first_difference.key
    'root.scatter.0.forward.output.0'
    """
    g_run = golden if isinstance(golden, Run) else load_run(golden)
    a_run = actual if isinstance(actual, Run) else load_run(actual)
    pending: dict[_Slot, Record] = dict(_slots(a_run, rank, step))
    diffs: list[BitwiseDifference] = []
    compared = equal = unhashed = 0
    for slot, g in _slots(g_run, rank, step):
        a = pending.pop(slot, None)
        if a is None:
            diffs.append(_difference("golden_only", g, g.hash, None))
            unhashed += g.hash is None
            continue
        if g.dtype != a.dtype or g.shape != a.shape:
            diffs.append(_difference("dtype" if g.dtype != a.dtype else "shape", g, g.hash, a.hash))
            continue
        if g.hash is None or a.hash is None:
            unhashed += (g.hash is None) + (a.hash is None)
            continue
        compared += 1
        if g.hash == a.hash:
            equal += 1
        else:
            diffs.append(_difference("hash", g, g.hash, a.hash))
    for a in pending.values():
        diffs.append(_difference("actual_only", a, None, a.hash))
        unhashed += a.hash is None
    verdict = "differs" if diffs else "identical"
    if not diffs and (unhashed or compared == 0):
        verdict = "inconclusive"
    return BitwiseComparison(
        golden=str(g_run.path),
        actual=str(a_run.path),
        verdict=verdict,
        compared=compared,
        equal=equal,
        unhashed=unhashed,
        first_difference=diffs[0] if diffs else None,
        differences=diffs[:MAX_LISTED],
        total_differences=len(diffs),
    )


def render_bitwise(result: BitwiseComparison) -> str:
    """The terminal summary of a bitwise comparison: verdict, counts, first difference."""
    from precguard.text import shown

    lines = [
        f"bitwise: {result.verdict} ({result.equal} of {result.compared} hashed pairs equal"
        + (f", {result.unhashed} records without a hash" if result.unhashed else "")
        + ")"
    ]
    first = result.first_difference
    if first is not None:
        lines.append(
            f"first difference: {shown(first.key)} ({shown(first.module_type)}), step "
            f"{first.step}, rank {first.rank}: {first.reason}"
            # hashes are read from the recordings: escaped and cut like any of their text
            + (
                f" {shown(first.golden_hash, 40)} != {shown(first.actual_hash, 40)}"
                if first.reason == "hash"
                else ""
            )
        )
        if result.total_differences > 1:
            lines.append(f"{result.total_differences - 1} more records differ after it")
    elif result.verdict == "inconclusive":
        lines.append(
            "record both runs with hashes=True (precguard.monitor(..., hashes=True), "
            "precguard.watch(..., hashes=True)) to compare them bitwise"
        )
    return "\n".join(lines)
