"""Where an msprobe dump keeps its files, and how to tell one from a precguard recording.

msprobe writes, under the ``dump_path`` of its config::

    dump_path/
      step{N}/
        rank{R}/            (torch.distributed initialised)  or  proc{PID}/  (single process)
          dump.json         {task, level, framework, dump_data_dir, data: {name: {...}}}
          construct.json    {name: parent name or null}: which call ran inside which
          stack.json        call stacks (not read)
          dump_tensor_data/ {data_name}.pt | .npy   (task "tensor" only)

Any of the three levels can be given: the dump path, one ``step{N}`` folder, or
one rank folder (the folder holding ``dump.json``). ``proc{PID}`` folders take
the ranks after the highest ``rank{R}`` of their step, in PID order, as
msprobe's own tools number them.

Every name comes from an untrusted directory and is resolved with precguard's
path rules (:func:`~precguard.dump.paths.resolve_member`): nothing outside the
dump is read.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from precguard.dump.paths import resolve_member
from precguard.errors import DumpFormatError
from precguard.text import shown

_STEP = re.compile(r"step(0|[1-9][0-9]{0,8})", re.ASCII)
_RANK = re.compile(r"(rank|proc)(0|[1-9][0-9]{0,9})", re.ASCII)

#: most rank folders looked at per step (a hostile dump cannot make detection slow)
MAX_RANK_DIRS = 65536


@dataclass(frozen=True)
class RankDump:
    """One ``dump.json`` and the folder it sits in."""

    step: int
    rank: int
    #: the folder's path relative to the dump root ('' when the root is the rank folder)
    rel: str

    def member(self, root: Path, name: str, *, what: str) -> Path:
        """The real path of ``name`` inside this rank folder (path rules applied)."""
        return resolve_member(root, f"{self.rel}/{name}" if self.rel else name, what=what)


def _listdir(path: Path) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError as exc:
        raise DumpFormatError(f"{shown(path)}: cannot list ({exc.strerror or exc})") from exc


def is_msprobe_dump(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` looks like an msprobe dump (and is no precguard recording).

    Cheap: looks for ``dump.json`` at the three levels a dump can be given at.
    """
    root = Path(path)
    if not root.is_dir() or (root / "manifest.json").exists():
        return False
    if (root / "dump.json").is_file():
        return True
    try:
        names = _listdir(root)
    except DumpFormatError:
        return False
    for name in names[:MAX_RANK_DIRS]:
        if _RANK.fullmatch(name) and (root / name / "dump.json").is_file():
            return True
        if _STEP.fullmatch(name) and (root / name).is_dir():
            for sub in _listdir(root / name)[:MAX_RANK_DIRS]:
                if _RANK.fullmatch(sub) and (root / name / sub / "dump.json").is_file():
                    return True
    return False


def find_rank_dumps(root: Path) -> list[RankDump]:
    """Every ``dump.json`` of the dump at ``root``, ordered by rank, then step.

    :raises DumpFormatError: ``root`` holds no msprobe dump, or a folder that should
        hold one leads outside it.
    """
    if not root.is_dir():
        raise DumpFormatError(f"{shown(root)}: no such msprobe dump directory")
    if resolve_member(root, "dump.json", what="msprobe dump").is_file():
        step_m = _STEP.fullmatch(root.resolve().parent.name)
        return [RankDump(int(step_m.group(1)) if step_m else 0, _own_rank(root), "")]
    names = _listdir(root)
    if any(_RANK.fullmatch(n) for n in names):
        step_m = _STEP.fullmatch(root.resolve().name)
        found = _ranks_of_step(root, "", int(step_m.group(1)) if step_m else 0, names)
    else:
        found = []
        for name in names:
            m = _STEP.fullmatch(name)
            if m and resolve_member(root, name, what="step folder").is_dir():
                found.extend(_ranks_of_step(root, name, int(m.group(1)), _listdir(root / name)))
    if not found:
        raise DumpFormatError(
            f"{shown(root)}: no msprobe dump.json here (looked for dump.json, "
            "rank*/dump.json and step*/rank*/dump.json)"
        )
    return sorted(found, key=lambda d: (d.rank, d.step))


def _own_rank(folder: Path) -> int:
    m = _RANK.fullmatch(folder.resolve().name)
    return int(m.group(2)) if m and m.group(1) == "rank" else 0


def _ranks_of_step(root: Path, rel: str, step: int, names: list[str]) -> list[RankDump]:
    ranks: list[tuple[int, str]] = []
    procs: list[tuple[int, str]] = []
    for name in names[:MAX_RANK_DIRS]:
        m = _RANK.fullmatch(name)
        if m is None:
            continue
        sub = f"{rel}/{name}" if rel else name
        if not resolve_member(root, f"{sub}/dump.json", what=f"rank folder {name}").is_file():
            continue
        (ranks if m.group(1) == "rank" else procs).append((int(m.group(2)), sub))
    ranks.sort()
    procs.sort()
    first_free = ranks[-1][0] + 1 if ranks else 0
    out = [RankDump(step, r, sub) for r, sub in ranks]
    out += [RankDump(step, first_free + i, sub) for i, (_, sub) in enumerate(procs)]
    return out
