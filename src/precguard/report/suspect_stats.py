"""Statistics of the suspects and their siblings across layers, golden beside actual.

A comparison names modules; its JSON holds metrics, not the tensors'
statistics. For the report's small multiples the statistics (mean, std,
absmax) are read back from the two recordings: for each suspect, the same
record of every module of its *family* (its name with the layer indices
replaced by ``*``: ``model.layers.*.mlp.down_proj``), in execution order, so
the plot shows whether the suspect's layer stands out or the drift grows
with depth.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from precguard.compare.report import Comparison, RecordResult
    from precguard.dump.schema import Stats

#: statistics drawn, one small panel each
PANEL_STATS: tuple[str, ...] = ("mean", "std", "absmax")
#: suspects drawn at most (the first divergence first)
MAX_SUSPECTS = 6

_INDEX = re.compile(r"(?<=\.)\d+(?=\.|$)")

RecordId = tuple[int, int, str]  # (rank, step, key)


def family(module: str) -> str:
    """``module`` with its numeric path parts as ``*``: the same module in every layer."""
    return _INDEX.sub("*", module)


def key_suffix(key: str, module: str) -> str:
    """What a record key adds to its module name: ``.{call}.{phase}.{role}.{index}``."""
    return key[len(module) :] if key.startswith(module) else key


@dataclass
class SuspectStats:
    """One suspect's family: per member, golden and actual statistics of the same record."""

    family: str
    record: str
    step: int
    rank: int
    labels: list[str] = field(default_factory=list)
    golden: dict[str, list[float | None]] = field(default_factory=dict)
    actual: dict[str, list[float | None]] = field(default_factory=dict)
    marked: int | None = None


def _members(result: Comparison, record: RecordResult) -> list[RecordResult]:
    fam, suffix = family(record.module), key_suffix(record.key, record.module)
    return [
        r
        for r in result.records
        if (r.step, r.rank, r.phase) == (record.step, record.rank, record.phase)
        and family(r.module) == fam
        and key_suffix(r.key, r.module) == suffix
        and r.status != "missing"
    ]


def _suspect_records(result: Comparison) -> list[RecordResult]:
    by_id = {(r.rank, r.step, r.key): r for r in result.records}
    named: list[tuple[int, int, str]] = []
    fd = result.first_divergence
    if fd is not None:
        named.append((fd.rank, fd.step, fd.key))
    named += [(s.rank, s.step, s.key) for s in result.suspects]
    out: list[RecordResult] = []
    seen: set[tuple[str, str, int, int]] = set()
    for ident in named:
        r = by_id.get(ident)
        if r is None:
            continue
        fam = (family(r.module), key_suffix(r.key, r.module), r.step, r.rank)
        if fam in seen:
            continue
        seen.add(fam)
        out.append(r)
        if len(out) >= MAX_SUSPECTS:
            break
    return out


def _read_stats(path: Path, wanted: set[RecordId]) -> dict[RecordId, Stats]:
    from precguard.dump.reader import load_run

    run = load_run(path)
    found: dict[RecordId, Stats] = {}
    ranks = {rank for rank, _, _ in wanted}
    for rank in run.ranks:
        if rank not in ranks:
            continue
        for rec in run.records(rank):
            ident = (rec.rank, rec.step, rec.key)
            if ident in wanted and rec.stats is not None:
                found[ident] = rec.stats
    return found


def suspect_stats(
    result: Comparison, golden: Path | None, actual: Path | None
) -> tuple[list[SuspectStats], str]:
    """The suspects' family statistics from both recordings, and a note ('' when all is well).

    Recordings that cannot be read (moved, deleted, refused by the strict
    reader) leave the list empty and say why in the note: the rest of the
    report does not need them.
    """
    from precguard.errors import PrecguardError

    suspects = _suspect_records(result)
    if not suspects:
        return [], ""
    if golden is None or actual is None:
        return [], (
            "statistics per layer not drawn: the recordings are not at hand (precguard "
            "report reads them from where the comparison found them, or --golden/--actual)"
        )
    groups = [(s, _members(result, s)) for s in suspects]
    g_wanted = {(r.rank, r.step, r.key) for _, rs in groups for r in rs}
    a_wanted = {(r.rank, r.step, r.actual_key or r.key) for _, rs in groups for r in rs}
    try:
        g_stats = _read_stats(golden, g_wanted)
        a_stats = _read_stats(actual, a_wanted)
    except (PrecguardError, OSError) as exc:
        return [], f"statistics per layer not drawn: the recordings cannot be read ({exc})"
    out: list[SuspectStats] = []
    for suspect, members in groups:
        entry = SuspectStats(
            family=family(suspect.module),
            record=key_suffix(suspect.key, suspect.module).lstrip("."),
            step=suspect.step,
            rank=suspect.rank,
            golden={s: [] for s in PANEL_STATS},
            actual={s: [] for s in PANEL_STATS},
        )
        for r in members:
            g = g_stats.get((r.rank, r.step, r.key))
            a = a_stats.get((r.rank, r.step, r.actual_key or r.key))
            if g is None and a is None:
                continue
            if r.key == suspect.key:
                entry.marked = len(entry.labels)
            indices = _INDEX.findall(r.module)
            entry.labels.append(".".join(indices) if indices else r.module)
            for s in PANEL_STATS:
                entry.golden[s].append(None if g is None else getattr(g, s))
                entry.actual[s].append(None if a is None else getattr(a, s))
        if entry.labels:
            out.append(entry)
    note = "" if out else "the recordings hold no statistics for the suspects' records"
    return out, note
