"""``compare --layout``: compare gathered views, then say which rank holds the error.

:class:`LayoutViews` gathers each side that has more than one rank into a
one-rank view (:func:`precguard.layout.gather.gather_run`), lets compare run on
the views unchanged, and :meth:`LayoutViews.finish` maps the result back onto
the real recordings:

- each record's ``rank`` becomes the first rank of the group that held it
  (the pipeline stage's first rank);
- a record whose shards could not be combined (partial sums without saved
  tensors) is ``missing``, with a note, never a pass;
- the first divergence and the suspects name the rank whose shard holds the
  error: each rank's shard is compared with the matching slice of the golden
  (:mod:`precguard.layout.attribute`).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from precguard.compare.levels import UnmeasuredMetrics
from precguard.compare.report import Comparison, Counts, RecordResult
from precguard.compare.tolerance import Profile
from precguard.dump.reader import Run
from precguard.layout.attribute import attribute
from precguard.layout.gather import Gathered, Source, gather_run, scratch_dir
from precguard.layout.spec import LayoutSpec, load_layout

NOT_COMBINABLE = (
    "not combinable: partial sums across ranks {ranks} and no saved tensors to add up "
    "(statistics of a sum do not follow from the summands'); record this module with "
    "--tensors to compare it"
)


class LayoutViews:
    """The two sides of a comparison as one-rank views, gathered by a layout spec."""

    def __init__(self, golden: Run, actual: Run, layout: str | Path | LayoutSpec) -> None:
        self.spec = load_layout(layout)
        self._tmp: tempfile.TemporaryDirectory[str] | None = scratch_dir()
        root = Path(self._tmp.name)
        self.golden_original, self.actual_original = golden, actual
        self.g: Gathered | None = None
        self.a: Gathered | None = None
        self.warnings: list[str] = []
        if len(golden.ranks) > 1:
            self.g = gather_run(golden, self.spec, root / "golden")
            self.warnings += [f"golden: {w}" for w in self.g.warnings]
        if len(actual.ranks) > 1:
            self.a = gather_run(actual, self.spec, root / "actual")
            self.warnings += [f"actual: {w}" for w in self.a.warnings]
        if self.g is None and self.a is None:
            self.warnings.append(
                f"--layout {self.spec.name}: both recordings have one rank; nothing to gather"
            )

    @property
    def golden(self) -> Run:
        """The golden as compare sees it."""
        return self.g.run if self.g is not None else self.golden_original

    @property
    def actual(self) -> Run:
        """The actual as compare sees it."""
        return self.a.run if self.a is not None else self.actual_original

    def real_paths(self, text: str) -> str:
        """``text`` with the gathered views' paths replaced by the recordings'."""
        for view, real in ((self.g, self.golden_original), (self.a, self.actual_original)):
            if view is not None:
                text = text.replace(str(view.run.path), f"{real.path} (gathered)")
        return text

    def close(self) -> None:
        """Remove the gathered views."""
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def finish(self, result: Comparison, profile: Profile, tol_mode: str) -> Comparison:
        """``result`` (of the views) as a result on the real recordings; closes the views."""
        try:
            records = [self._record(r) for r in result.records]
            counts = Counts.of(records)
            verdict = "diverged" if counts.failed or counts.nonfinite else "match"
            first, suspects, notes = attribute(self, result, profile, tol_mode)
            dropped = counts.missing - result.counts.missing
            warnings = [self.real_paths(w) for w in result.warnings] + self.warnings + notes
            if dropped:
                warnings.append(
                    f"{dropped} record(s) are partial sums without saved tensors: not "
                    "combinable, not compared (record them with --tensors)"
                )
            coverage = result.coverage
            if coverage is not None:
                coverage = coverage.model_copy(
                    update={"gaps": [self.real_paths(g) for g in coverage.gaps]}
                )
            return result.model_copy(
                update={
                    "golden": str(self.golden_original.path),
                    "actual": str(self.actual_original.path),
                    "records": records,
                    "counts": counts,
                    "verdict": verdict,
                    "first_divergence": first,
                    "suspects": suspects,
                    "warnings": warnings,
                    "coverage": coverage,
                }
            )
        finally:
            self.close()

    def source(self, step: int, key: str, *, golden: bool = False) -> Source | None:
        """The source of a gathered record (None when that side was not gathered)."""
        side = self.g if golden else self.a
        return None if side is None else side.sources.get((step, key))

    def _record(self, r: RecordResult) -> RecordResult:
        src = self.source(r.step, r.actual_key or r.key)
        if src is None:
            src = self.source(r.step, r.key, golden=True)
        if src is None:
            return r
        update: dict[str, object] = {"rank": src.ranks[0]}
        if not src.combinable and r.status == "pass":
            update["status"] = "missing"
            update["metrics"] = UnmeasuredMetrics(
                level="none",
                dtype=r.metrics.dtype if r.metrics is not None else r.golden_dtype,
                error=0.0,
                note=NOT_COMBINABLE.format(ranks=list(src.ranks)),
            )
        return r.model_copy(update=update)
