"""Gather a tensor-/pipeline-parallel recording into the recording of one whole model.

:func:`gather_run` reads the ranks of a recording one step at a time, puts
each record's shards back together as the layout spec says (see
:mod:`precguard.layout.combine`), merges the pipeline stages in execution
order and writes the result as an ordinary one-rank recording, so compare
runs on it unchanged. Memory holds one step's metadata and one chunk of
gathered tensors.

Execution order across stages, for one step: the forward records of stage 0,
then stage 1, ...; the backward records of the last stage first. The root
module appears on every stage; its inputs are taken from the first stage and
its outputs from the last, the ends of the whole model.
"""

from __future__ import annotations

import os
import tempfile
from collections import defaultdict, deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from itertools import groupby
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precguard.compare.align import Renamer
from precguard.dump.reader import Run, load_run
from precguard.dump.schema import Record, Stats, TensorRef
from precguard.errors import DumpFormatError, UsageError
from precguard.layout.combine import concat_shape, concat_stats, sum_partials, tensor_stats
from precguard.layout.spec import LayoutSpec, Placement, Shard
from precguard.text import shown

if TYPE_CHECKING:
    import torch

#: gathered tensors are written in files of about this many bytes
CHUNK_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class Source:
    """Where one gathered record came from."""

    #: the ranks whose records were combined (a tensor-parallel group of one stage)
    ranks: tuple[int, ...]
    #: ``replicate``, ``partial`` or ``shard:D``
    placement: str
    #: False for partial sums without saved tensors: nothing to compare
    combinable: bool = True
    #: ranks whose copy of a replicated tensor differs from the first rank's (statistics)
    replica_mismatch: tuple[int, ...] = ()


def placement_name(p: Placement) -> str:
    """``replicate``, ``partial`` or ``shard:D``."""
    return f"shard:{p.shard}" if isinstance(p, Shard) else p


@dataclass
class Gathered:
    """A one-rank view of a parallel recording, and where each of its records came from."""

    original: Run
    run: Run
    spec: LayoutSpec
    grid: list[list[int]]
    #: (step, key) -> source; a key repeated within a step keeps its first source
    sources: dict[tuple[int, str], Source] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)

    def stage_of(self, rank: int) -> int:
        """The pipeline stage of ``rank``."""
        for s, ranks in enumerate(self.grid):
            if rank in ranks:
                return s
        raise KeyError(rank)


def gather_run(run: Run | str | os.PathLike[str], spec: LayoutSpec, out: Path) -> Gathered:
    """Write the one-rank view of the parallel recording ``run`` under ``out``.

    :raises UsageError: the layout does not fit the recording (rank count, shapes).
    :raises DumpFormatError: the recording is unreadable.
    """
    original = run if isinstance(run, Run) else load_run(run)
    world = len(original.ranks)
    if original.ranks != list(range(world)):
        raise DumpFormatError(
            f"{original.path}: ranks {original.ranks} are not 0..{world - 1}; a rank's records "
            "are missing, so its shards cannot be gathered"
        )
    grid = spec.grid(world)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rank0").mkdir(exist_ok=True)
    gathered = Gathered(original=original, run=original, spec=spec, grid=grid)
    writer = _Writer(out / "rank0")
    used = [r for stage in grid for r in stage]
    if len(used) < world:
        gathered.warnings.append(
            f"data_parallel {spec.data_parallel}: replica 0 (ranks {used}) gathered; the other "
            "replicas' ranks are not compared"
        )
    steps = _lockstep(original, used, gathered.warnings)
    last_step = -1
    renamer = Renamer()
    mismatched: list[str] = []
    try:
        for step, by_rank in steps:
            last_step = step
            stages = [
                _gather_stage(original, spec, ranks, by_rank, renamer, gathered.warnings)
                for ranks in grid
            ]
            for rec, tensor, source in _merge_stages(stages):
                gathered.sources.setdefault((step, rec.key), source)
                if source.replica_mismatch and rec.role == "param" and len(mismatched) < 5:
                    mismatched.append(rec.module)
                writer.add(rec, tensor)
            writer.end_step(step)
    finally:
        writer.close()
    if mismatched:
        gathered.warnings.append(
            f"parameters of {', '.join(dict.fromkeys(mismatched))} differ across the ranks "
            "of their group, but the layout says they are replicated: are they split? "
            "(a rule with kind column/row or params: {weight: {shard: DIM}})"
        )
    m = original.manifest
    manifest = m.model_copy(
        update={
            "world_size": 1,
            "options": {**m.options, "gathered_from": str(original.path), "layout": spec.name},
            "steps": m.steps if m.steps is not None else (last_step + 1 if m.complete else None),
        }
    )
    (out / "manifest.json").write_text(manifest.model_dump_json(indent=2), encoding="utf-8")
    gathered.run = load_run(out)
    return gathered


def _lockstep(
    run: Run, ranks: list[int], warnings: list[str]
) -> Iterator[tuple[int, dict[int, list]]]:
    """Yield ``(step, {rank: records})`` for the steps each of ``ranks`` recorded."""
    iters = {r: groupby(run.records(r), key=lambda rec: rec.step) for r in ranks}
    heads = {r: next(it, None) for r, it in iters.items()}
    while all(h is not None for h in heads.values()):
        step = max(h[0] for h in heads.values())  # type: ignore[index]
        behind = [r for r, h in heads.items() if h[0] < step]  # type: ignore[index]
        if behind:
            for r in behind:
                warnings.append(f"rank {r} step {heads[r][0]}: not on every rank; not gathered")  # type: ignore[index]
                heads[r] = next(iters[r], None)
            continue
        yield step, {r: list(h[1]) for r, h in heads.items()}  # type: ignore[index]
        heads = {r: next(it, None) for r, it in iters.items()}
    short = [r for r, h in heads.items() if h is None]
    longer = [r for r, h in heads.items() if h is not None]
    if longer:
        warnings.append(
            f"ranks {longer} recorded steps that ranks {short} did not; those steps are "
            "not gathered"
        )


@dataclass
class _Item:
    rec: Record
    tensor: torch.Tensor | None
    source: Source


def _gather_stage(
    run: Run,
    spec: LayoutSpec,
    ranks: list[int],
    by_rank: dict[int, list[Record]],
    renamer: Renamer,
    warnings: list[str],
) -> list[_Item]:
    lead = by_rank[ranks[0]]
    others: list[dict[str, deque[Record]]] = []
    for r in ranks[1:]:
        index: dict[str, deque[Record]] = defaultdict(deque)
        for rec in by_rank[r]:
            index[rec.key].append(rec)
        others.append(index)
    wrapped = any(r.module == "root" and r.module_type.endswith("DataParallel") for r in lead)
    items = []
    for rec in lead:
        parts = [rec]
        for r, index in zip(ranks[1:], others, strict=True):
            queue = index.get(rec.key)
            if not queue:
                raise UsageError(
                    f"{run.path}: rank {r} has no record {shown(rec.key)} of step {rec.step} "
                    f"that rank {ranks[0]} has: ranks {ranks} are not one tensor-parallel "
                    "group of the same model (check the layout's tensor_parallel and "
                    "pipeline_stages)"
                )
            parts.append(queue.popleft())
        module = renamer.name(rec.module, root_wrapped=wrapped)
        placement = spec.placement(module, rec.phase, rec.role, rec.index, rec.name)
        items.append(_combine(run, ranks, parts, placement))
    for r, index in zip(ranks[1:], others, strict=True):
        extra = [q[0].key for q in index.values() if q]
        if extra and len(warnings) < 20:
            warnings.append(
                f"rank {r} step {lead[0].step if lead else '?'}: {len(extra)} record(s) that "
                f"rank {ranks[0]} does not have (e.g. {shown(extra[0])}); not gathered"
            )
    return items


def _combine(run: Run, ranks: list[int], parts: list[Record], placement: Placement) -> _Item:
    import torch

    lead = parts[0]
    pname = placement_name(placement)
    dtypes = {p.dtype for p in parts}
    if len(dtypes) > 1:
        raise UsageError(
            f"{run.path}: record {shown(lead.key)} has dtypes {sorted(dtypes)} across ranks "
            f"{ranks}; shards of one tensor share a dtype"
        )
    saved = all(p.tensor is not None for p in parts)
    if len(parts) == 1 or placement == "replicate":
        return _replicated(run, ranks, parts, pname)
    if placement == "partial":
        _same_shapes(run, ranks, parts, pname)
        if not saved:
            source = Source(tuple(ranks), pname, combinable=False)
            return _Item(lead.model_copy(update={"stats": None, "tensor": None}), None, source)
        whole = sum_partials([run.tensor(p) for p in parts])
        rec = lead.model_copy(update={"stats": tensor_stats(whole)})
        return _Item(rec, whole, Source(tuple(ranks), pname))
    assert isinstance(placement, Shard)
    shape = concat_shape([p.shape for p in parts], placement.shard)
    if shape is None:
        raise UsageError(
            f"layout says {shown(lead.module)} {lead.phase} {lead.role} {lead.index} is split "
            f"along dim {placement.shard}, but ranks {ranks} hold shapes "
            f"{[p.shape for p in parts]} that do not concatenate there; fix the layout rule"
        )
    tensor = torch.cat([run.tensor(p) for p in parts], dim=placement.shard) if saved else None
    if all(p.stats is not None for p in parts):
        stats: Stats | None = concat_stats([p.stats for p in parts])  # type: ignore[misc]
    else:
        stats = tensor_stats(tensor) if tensor is not None else None
    rec = lead.model_copy(update={"shape": shape, "stats": stats})
    return _Item(rec, tensor, Source(tuple(ranks), pname))


def _same_shapes(run: Run, ranks: list[int], parts: list[Record], what: str) -> None:
    shapes = {tuple(p.shape) for p in parts}
    if len(shapes) > 1:
        lead = parts[0]
        raise UsageError(
            f"layout says {shown(lead.module)} {lead.phase} {lead.role} {lead.index} is "
            f"{what} across ranks {ranks}, but they hold shapes {[p.shape for p in parts]}; "
            "fix the layout rule (a split tensor is {shard: DIM})"
        )


def _replicated(run: Run, ranks: list[int], parts: list[Record], pname: str) -> _Item:
    _same_shapes(run, ranks, parts, "replicated")
    lead = parts[0]
    differ = tuple(
        r for r, p in zip(ranks[1:], parts[1:], strict=True) if not _same_stats(p.stats, lead.stats)
    )
    tensor = run.tensor(lead) if lead.tensor is not None else None
    return _Item(lead, tensor, Source(tuple(ranks), pname, replica_mismatch=differ))


def _same_stats(a: Stats | None, b: Stats | None) -> bool:
    if a is None or b is None:
        return a is b
    return all(
        x == y or (x != x and y != y)  # NaN statistics are equal to each other
        for x, y in zip(a.model_dump().values(), b.model_dump().values(), strict=True)
    )


def _merge_stages(
    stages: list[list[_Item]],
) -> Iterator[tuple[Record, torch.Tensor | None, Source]]:
    """The items of every stage in execution order (see the module docstring)."""
    last = len(stages) - 1
    for phase, order in (("forward", range(last + 1)), ("backward", range(last, -1, -1))):
        for s in order:
            for item in stages[s]:
                rec = item.rec
                if rec.phase != phase:
                    continue
                if last and rec.module == "root" and rec.role in ("input", "output"):
                    end = 0 if rec.role == "input" else last
                    if s != end:
                        continue  # an inner stage boundary, not an end of the whole model
                yield rec, item.tensor, item.source


class _Writer:
    """Writes gathered records (rank 0) and their tensors in chunked safetensors files."""

    def __init__(self, rank_dir: Path) -> None:
        self.dir = rank_dir
        self.records = open(rank_dir / "records.jsonl", "w", encoding="utf-8")  # noqa: SIM115
        self.seq = 0
        self.pending: list[tuple[Record, str | None]] = []
        self.tensors: dict[str, torch.Tensor] = {}
        self.bytes = 0
        self.chunk = 0

    def add(self, rec: Record, tensor: torch.Tensor | None) -> None:
        update: dict[str, Any] = {"rank": 0, "seq": self.seq, "tensor": None}
        name = None
        if tensor is not None:
            name = str(self.seq)
            self.tensors[name] = tensor.contiguous()
            self.bytes += tensor.numel() * tensor.element_size()
        self.seq += 1
        self.pending.append((rec.model_copy(update=update), name))
        if self.bytes >= CHUNK_BYTES:
            self._flush(rec.step)

    def end_step(self, step: int) -> None:
        self._flush(step)

    def _flush(self, step: int) -> None:
        file = None
        if self.tensors:
            from safetensors.torch import save_file  # gathered tensors: torch is loaded

            file = f"tensors-{step:06d}-{self.chunk:04d}.safetensors"
            self.chunk += 1
            save_file(self.tensors, str(self.dir / file))
        lines = []
        for rec, name in self.pending:
            if name is not None:
                rec = rec.model_copy(update={"tensor": TensorRef(file=file, name=name)})
            lines.append(rec.model_dump_json())
        if lines:
            self.records.write("\n".join(lines) + "\n")
        self.pending.clear()
        self.tensors = {}
        self.bytes = 0

    def close(self) -> None:
        self.records.close()


def scratch_dir() -> tempfile.TemporaryDirectory[str]:
    """A temporary directory for gathered views, removed when compare is done."""
    return tempfile.TemporaryDirectory(prefix="precguard-layout-")
