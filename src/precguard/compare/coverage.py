"""What a comparison actually compared: steps, phases, ranks, and whether both runs finished.

A comparison can only vouch for the records it paired, so the verdict says first what
it did not compare (docs/compare.md, "What was compared (coverage)"): the same
recording on both sides is refused (:class:`SameRecordingError`); a run that did not
finish is named with its exception; steps, phases and ranks that only one side
recorded are excluded from pairing and counted. A coverage left *partial* makes
``precguard compare`` print PARTIAL MATCH instead of MATCH and exit 3, unless
``--allow-partial`` says the narrower comparison was meant.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from rich.console import Console
from rich.text import Text

from precguard.dump.paths import RECORDS_FILE, rank_dir
from precguard.dump.reader import Run
from precguard.dump.schema import Record
from precguard.errors import PrecguardError

_FROZEN = ConfigDict(frozen=True)

#: bytes read from the end of a records file to find its last step
_TAIL_BYTES = 1 << 16
#: bytes read at a time when listing the steps a records file holds
_SCAN_BYTES = 1 << 22
#: what a :class:`CoverageTracker` counts as it pairs steps, by attribute name
_TALLIES = ("compared", "phases", "only_golden", "only_actual")
#: a record's step field (module names are JSON strings: a quote inside one is escaped)
_STEP_FIELD = re.compile(rb'"step":\s*(\d+)')


class SameRecordingError(PrecguardError):
    """Golden and actual are one recording (the same directory, or a copy of it)."""


class RunState(BaseModel):
    """How one side's recording ended, when it did not finish cleanly."""

    model_config = _FROZEN

    side: str = Field(description="'golden' or 'actual'.")
    path: str = Field(description="The recording directory.")
    error: str | None = Field(
        default=None,
        description="'Type: message' of the exception that ended the run; None when it "
        "was killed (or is still running).",
    )
    steps: int | None = Field(default=None, description="Steps it recorded, if known.")
    steps_run: int | None = Field(
        default=None,
        description="Steps the run went through, when it recorded fewer (the recording "
        "stopped at an I/O error and the run went on).",
    )

    def describe(self) -> str:
        """One line: which side, and how it ended."""
        where = f"{self.side} {self.path} is incomplete"
        if self.error is None:
            return f"{where}: the run did not close (killed, or still running)"
        if self.steps is None:
            return f"{where}: the run raised {self.error}"
        if self.steps_run is not None:
            return (
                f"{where}: the recording stopped at {self.error} after {self.steps} of the "
                f"run's {self.steps_run} step(s)"
            )
        return (
            f"{where}: the run raised {self.error} ({self.steps} step(s) recorded, the last "
            "possibly cut short)"
        )


class Coverage(BaseModel):
    """What part of the two recordings the comparison paired, and what it left out."""

    model_config = _FROZEN

    complete: bool = Field(
        description="True when both runs finished and every step, phase and rank either "
        "side recorded (within --rank/--step) was compared."
    )
    steps_compared: int = Field(description="(rank, step) pairs compared.")
    golden_steps: int = Field(description="(rank, step) pairs the golden holds in scope.")
    actual_steps: int = Field(description="(rank, step) pairs the actual holds in scope.")
    phases_compared: list[str] = Field(
        default_factory=list, description="Phases paired in at least one step."
    )
    phases_only_in_golden: list[str] = Field(
        default_factory=list, description="Phases the golden recorded that actual did not."
    )
    phases_only_in_actual: list[str] = Field(
        default_factory=list, description="Phases the actual recorded that golden did not."
    )
    incomplete_runs: list[RunState] = Field(
        default_factory=list, description="Sides whose run did not finish."
    )
    gaps: list[str] = Field(
        default_factory=list,
        description="One line per thing not compared, most important first (shown at the "
        "top of the terminal report).",
    )


def ensure_distinct(golden: Run, actual: Run) -> None:
    """Refuse to compare a recording with itself: it would MATCH and prove nothing.

    :raises SameRecordingError: same directory, or the same ``run_id`` (a copy).
    """
    same_dir = False
    with contextlib.suppress(OSError):  # a side that cannot be read is not the other
        same_dir = os.path.samefile(golden.path, actual.path)
    g_id, a_id = golden.manifest.run_id, actual.manifest.run_id
    if same_dir or (g_id and g_id == a_id and _same_records(golden, actual)):
        how = "the same directory" if same_dir else f"a copy of it: run_id {g_id}"
        raise SameRecordingError(
            f"{actual.path} is the same recording as golden {golden.path} ({how}): comparing "
            "a recording with itself measures nothing; record the run under test separately"
        )


def _same_records(golden: Run, actual: Run) -> bool:
    """True when every rank's records file is byte-identical on both sides (a copy whose
    records were since replaced is a different recording)."""
    if golden.ranks != actual.ranks:
        return False
    files = [(rank_dir(golden.path, r), rank_dir(actual.path, r)) for r in golden.ranks]
    pairs = [(g / RECORDS_FILE, a / RECORDS_FILE) for g, a in files]
    if any(g.stat().st_size != a.stat().st_size for g, a in pairs):
        return False
    return all(_digest(g) == _digest(a) for g, a in pairs)


def _digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def run_states(golden: Run, actual: Run) -> list[RunState]:
    """The sides whose recording did not finish cleanly (``complete: false``)."""
    states = []
    for side, run in (("golden", golden), ("actual", actual)):
        m = run.manifest
        if m.complete:
            continue
        error = None
        if m.error is not None:
            error = f"{m.error.type}: {m.error.message}" if m.error.message else m.error.type
        short = m.steps_run if m.steps_run is not None and m.steps_run != m.steps else None
        states.append(
            RunState(side=side, path=str(run.path), error=error, steps=m.steps, steps_run=short)
        )
    return states


def incomplete_note(golden: Run, actual: Run) -> str:
    """``"; <side> is incomplete: ..."`` for error messages, or ``""``."""
    return "".join(f"; {s.describe()}" for s in run_states(golden, actual))


def last_step(run: Run, rank: int) -> int | None:
    """The step of the last readable record of ``rank`` (None when it has none), from the
    file's tail: records are written in step order (a line cut short by a kill is skipped).
    """
    path = rank_dir(run.path, rank) / RECORDS_FILE
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - _TAIL_BYTES))
            tail = fh.read()
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        try:
            step = json.loads(line).get("step")
        except (ValueError, AttributeError):
            continue
        if isinstance(step, int):
            return step
    return None


def recorded_steps(run: Run, rank: int) -> set[int]:
    """Every step ``rank`` recorded (a sampled recording, the watch's ``every=N``, holds
    steps 0, N, 2N, ... only), in one pass over the records file reading the step fields.
    """
    path = rank_dir(run.path, rank) / RECORDS_FILE
    steps: set[int] = set()
    tail = b""
    try:
        with open(path, "rb") as fh:
            while chunk := fh.read(_SCAN_BYTES):
                buf = tail + chunk
                cut = buf.rfind(b"\n") + 1
                steps.update(int(x) for x in _STEP_FIELD.findall(buf[:cut]))
                tail = buf[cut:]
    except OSError:
        return steps
    steps.update(int(x) for x in _STEP_FIELD.findall(tail))
    return steps


class CoverageTracker:
    """Keeps the account while :func:`precguard.compare_runs` walks the steps: :meth:`pair`
    with each step both sides recorded, then :meth:`result` once at the end."""

    def __init__(self, golden: Run, actual: Run, *, rank: int | None, step: int | None) -> None:
        self.golden = golden
        self.actual = actual
        self.rank = rank
        self.step = step
        self.compared: set[tuple[int, int]] = set()
        self.phases: set[str] = set()
        self.only_golden: set[str] = set()
        self.only_actual: set[str] = set()

    def tallies(self) -> dict[str, set[Any]]:
        """What it counted so far, by name: the fields of the same names a shard's result
        (:class:`~precguard.compare.units.ShardResult`) carries to the merge."""
        return {name: getattr(self, name) for name in _TALLIES}

    def add(self, *shards: Any) -> None:
        """Take in what other processes counted (their shards' :meth:`tallies`)."""
        for shard in shards:
            for name in _TALLIES:
                getattr(self, name).update(getattr(shard, name))

    def pair(
        self, rank: int, step: int, g_recs: list[Record], a_recs: list[Record]
    ) -> tuple[list[Record], list[Record]]:
        """Note that (rank, step) is compared; keep only the phases both sides recorded, and
        buffer records only when both sides recorded buffers (an older recorder kept none).
        """
        self.compared.add((rank, step))
        g_buf = any(r.role == "buffer" for r in g_recs)
        if g_buf != any(r.role == "buffer" for r in a_recs):
            if g_buf:
                g_recs = [r for r in g_recs if r.role != "buffer"]
            else:
                a_recs = [r for r in a_recs if r.role != "buffer"]
        g_phases = {r.phase for r in g_recs}
        a_phases = {r.phase for r in a_recs}
        common = g_phases & a_phases
        self.phases |= common
        if g_phases == a_phases:
            return g_recs, a_recs
        self.only_golden |= g_phases - a_phases
        self.only_actual |= a_phases - g_phases
        return [r for r in g_recs if r.phase in common], [r for r in a_recs if r.phase in common]

    def _steps_in_scope(self, run: Run) -> set[tuple[int, int]]:
        ranks = run.ranks if self.rank is None else [r for r in run.ranks if r == self.rank]
        held: set[tuple[int, int]] = set()
        for r in ranks:
            last = last_step(run, r)
            if last is None:
                continue
            wanted = range(last + 1) if self.step is None else range(self.step, self.step + 1)
            steps = {(r, s) for s in wanted if s <= last}
            if not steps <= self.compared:  # a gap: is it a step this side never recorded?
                have = recorded_steps(run, r)
                steps = {(r, s) for r, s in steps if s in have or (r, s) in self.compared}
            held |= steps
        return held

    def result(self) -> Coverage:
        """The coverage of the comparison just made."""
        g_held = self._steps_in_scope(self.golden)
        a_held = self._steps_in_scope(self.actual)
        states = run_states(self.golden, self.actual)
        gaps = [s.describe() for s in states]
        union = g_held | a_held
        if self.compared != union:
            ranks = " (steps of all ranks)" if len({r for r, _ in union}) > 1 else ""
            gaps.append(
                f"{len(union - self.compared)} of {len(union)} steps{ranks}: golden holds "
                f"{len(g_held)}, actual {len(a_held)}, {len(self.compared)} compared"
            )
        for side, phases in (("golden", self.only_golden), ("actual", self.only_actual)):
            if phases:
                gaps.append(
                    f"the {' and '.join(sorted(phases))} pass, recorded only in {side} "
                    "(record both runs the same way, e.g. both with --train)"
                )
        return Coverage(
            complete=not gaps,
            steps_compared=len(self.compared),
            golden_steps=len(g_held),
            actual_steps=len(a_held),
            phases_compared=sorted(self.phases),
            phases_only_in_golden=sorted(self.only_golden),
            phases_only_in_actual=sorted(self.only_actual),
            incomplete_runs=states,
            gaps=gaps,
        )


def headline(verdict: str, coverage: Coverage | None) -> Text:
    """MATCH / DIVERGED, or PARTIAL MATCH when a match covers only part of the recordings."""
    if verdict != "match":
        return Text("DIVERGED", style="bold red")
    if coverage is not None and not coverage.complete:
        return Text("PARTIAL MATCH", style="bold yellow")
    return Text("MATCH", style="bold green")


def print_gaps(coverage: Coverage | None, console: Console) -> None:
    """Print what was not compared, before anything else in the report."""
    if coverage is None or coverage.complete:
        return
    for gap in coverage.gaps:
        console.print(Text.assemble(("not compared: ", "bold yellow"), gap))
