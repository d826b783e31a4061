"""Pair the records of two recordings (docs/compare.md, "Alignment").

Module names are first brought to one spelling on both sides (:class:`Renamer`: the
prefixes wrappers add stripped, the wrappers' own records dropped, then the user's
``--map OLD=NEW`` rules). A module call's inputs and outputs are paired by **name**
(``kwargs.attention_mask``, ``args.0``, ``output.1``), not by position; other records,
and an input passed by position on one side and by keyword on the other, by key. An
input or output only one side has in a call both recorded is *one-sided*
(``Alignment.one_sided``). Records left over are paired by order within the same
parent module, phase and role, preferring the same shape and dtype; a record without a
partner of the same shape stays unmatched: it is reported, never dropped.
"""

from __future__ import annotations

import difflib
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import overload

from precguard.dump.schema import Record
from precguard.errors import UsageError

#: classes that wrap a module and forward to it: their records repeat the wrapped module's
WRAPPER_TYPES = frozenset(
    {
        "DistributedDataParallel",
        "DataParallel",
        "FullyShardedDataParallel",
        "OptimizedModule",
        "CheckpointWrapper",
        "OffloadWrapper",
    }
)
#: the attribute under which those wrappers hold the wrapped module, anywhere in a name
WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_orig_mod", "_checkpoint_wrapped_module"})
#: FSDP2's ``fully_shard`` wraps nothing: it swaps a module's class for ``FSDP<Class>``
_FSDP2_PREFIX = "FSDP"


def fsdp2_class(name: str | None) -> str | None:
    """The class ``fully_shard`` gave a module of class ``name`` (``M`` -> ``FSDPM``)."""
    return None if name is None else _FSDP2_PREFIX + name


#: wrappers of the whole model that hold it as ``module`` (only a leading segment)
_ROOT_WRAPPERS = frozenset({"DistributedDataParallel", "DataParallel"})


@dataclass(frozen=True)
class RenameRule:
    """``OLD=NEW``: a module named OLD (a glob) is called NEW; ``*`` in NEW repeats OLD's.

    OLD matches a whole name or a leading part of it that ends at a dot, so
    ``transformer=model`` renames ``transformer.h.0`` to ``model.h.0``, and
    ``blocks.*=layers.*`` renames ``blocks.3.fc`` to ``layers.3.fc``.
    """

    old: str
    new: str
    pattern: re.Pattern[str]

    @classmethod
    def parse(cls, text: str) -> RenameRule:
        """Parse ``OLD=NEW``; raise UsageError saying what is wrong with it."""
        old, sep, new = text.partition("=")
        old, new = old.strip(), new.strip()
        if not sep or not old or not new or "=" in new:
            raise UsageError(f"--map {text!r}: expected OLD=NEW (e.g. 'blocks.*=layers.*')")
        wild_old = sum(old.count(c) for c in "*?")
        wild_new = sum(new.count(c) for c in "*?")
        if wild_new > wild_old:
            raise UsageError(
                f"--map {text!r}: NEW has {wild_new} wildcard(s) but OLD only {wild_old}; "
                "each * or ? in NEW repeats what the same-numbered one in OLD matched"
            )
        body = "".join("(.*)" if c == "*" else "(.)" if c == "?" else re.escape(c) for c in old)
        return cls(old, new, re.compile(body + r"(?P<rest>\..*)?"))

    def apply(self, module: str) -> str | None:
        """The new name of ``module``, or None when the rule does not match it."""
        m = self.pattern.fullmatch(module)
        if m is None:
            return None
        captures = iter(m.groups()[:-1])
        new = "".join(next(captures) if c in "*?" else c for c in self.new)
        return new + (m.group("rest") or "")


class Renamer:
    """One spelling of module names for both recordings: wrappers stripped, rules applied."""

    def __init__(self, rules: Sequence[RenameRule] = ()) -> None:
        self.rules = list(rules)
        self._cache: dict[tuple[str, bool], str] = {}

    @classmethod
    def from_strings(cls, rules: Iterable[str]) -> Renamer:
        """Build from ``--map`` arguments (``OLD=NEW``)."""
        return cls([RenameRule.parse(r) for r in rules])

    def name(self, module: str, *, root_wrapped: bool = False) -> str:
        """The common spelling of ``module`` (``root_wrapped``: the run's root is DDP)."""
        key = (module, root_wrapped)
        done = self._cache.get(key)
        if done is not None:
            return done
        parts = module.split(".")
        if root_wrapped and parts[0] == "module":
            parts = parts[1:] or ["root"]
        parts = [p for p in parts if p not in WRAPPER_SEGMENTS] or ["root"]
        name = ".".join(parts)
        for rule in self.rules:
            renamed = rule.apply(name)
            if renamed is not None:
                name = renamed
                break
        self._cache[key] = name
        return name

    def records(self, records: list[Record]) -> list[Record]:
        """``records`` with module names (and keys) in the common spelling, wrappers dropped."""
        root_wrapped = any(r.module == "root" and r.module_type in _ROOT_WRAPPERS for r in records)
        out: list[Record] = []
        for r in records:
            if r.module_type in WRAPPER_TYPES:
                continue
            name = self.name(r.module, root_wrapped=root_wrapped)
            if name != r.module:
                r = r.model_copy(update={"module": name, "key": name + r.key[len(r.module) :]})
            out.append(r)
        return out


def closest_unmatched(
    golden_only: Iterable[str], actual_only: Iterable[str], limit: int = 5
) -> str:
    """Name, for a few golden-only modules, the closest actual-only one, and a ``--map`` hint.

    Takes record keys; returns "" when there is nothing to pair.
    """
    g_mods = list(dict.fromkeys(_module_of(k) for k in golden_only))
    a_mods = list(dict.fromkeys(_module_of(k) for k in actual_only))
    if not g_mods or not a_mods:
        return ""
    pairs = []
    for g in g_mods:
        close = difflib.get_close_matches(g, a_mods, n=1, cutoff=0.5)
        if close:
            pairs.append((g, close[0]))
        if len(pairs) >= limit:
            break
    if not pairs:
        shown = ", ".join(g_mods[:limit])
        return f"golden-only modules: {shown}; actual-only: {', '.join(a_mods[:limit])}"
    text = "closest unmatched names (golden ~ actual): " + ", ".join(f"{g} ~ {a}" for g, a in pairs)
    hint = _map_hint(*pairs[0])
    return text + (f"; if they are the same modules renamed, try --map '{hint}'" if hint else "")


def _module_of(key: str) -> str:
    return key.rsplit(".", 4)[0] if key.count(".") >= 4 else key


def _map_hint(golden: str, actual: str) -> str | None:
    """``OLD=NEW`` for two names that differ in one dotted segment, else None."""
    g, a = golden.split("."), actual.split(".")
    if len(g) != len(a):
        return None
    diff = [i for i, (x, y) in enumerate(zip(g, a, strict=True)) if x != y]
    if len(diff) != 1:
        return None
    i = diff[0]
    if i == len(g) - 1:
        return f"*.{g[i]}=*.{a[i]}" if i else f"{g[i]}={a[i]}"
    return f"{'.'.join(g[: i + 1])}.*={'.'.join(a[: i + 1])}.*"


@dataclass
class Alignment:
    """The outcome of aligning one step of one rank."""

    pairs: list[tuple[Record, Record]] = field(default_factory=list)
    golden_only: list[Record] = field(default_factory=list)
    actual_only: list[Record] = field(default_factory=list)
    #: inputs/outputs only one side passed or returned in a call both recorded:
    #: (side, record), side 'golden' or 'actual'; in neither list above
    one_sided: list[tuple[str, Record]] = field(default_factory=list)


_CALL_IO = ("input", "output")


def _call_of(rec: Record) -> tuple[str, int, str, str]:
    return rec.module, rec.call, rec.phase, rec.role


def _kwarg(name: str) -> str | None:
    """The keyword of an input name (``kwargs.position_embeddings.0`` -> its keyword)."""
    return name.split(".", 2)[1] if name.startswith("kwargs.") else None


def _named_io(records: list[Record]) -> bool:
    """Whether the call inputs/outputs of ``records`` carry names (pre-name recordings do not)."""
    return any(r.name for r in records if r.role in _CALL_IO)


def _named(rec: Record) -> tuple[tuple[str, int, str, str], str] | None:
    """A call input's or output's (call, name), None for any other record."""
    return (_call_of(rec), rec.name) if rec.role in _CALL_IO and rec.name else None


def _pair_on(
    golden: list[Record],
    actual: list[Record],
    result: Alignment,
    used: set[int],
    key: Callable[[Record], object],
) -> list[Record]:
    """Pair each golden record with the unused actual one of the same ``key`` (None: no
    key); never two different keywords under one key (two different inputs). Return the
    golden records left."""
    by_key = {k: a for a in actual if (k := key(a)) is not None}
    left: list[Record] = []
    for g in golden:
        k = key(g)
        a = by_key.get(k) if k is not None else None
        if a is None or id(a) in used or _contradict(g, a):
            left.append(g)
            continue
        used.add(id(a))
        result.pairs.append((g, a))
    return left


def _not_one_sided(
    left: list[Record], other: list[Record], partners: list[Record], side: str, result: Alignment
) -> list[Record]:
    """``left`` less the records only this side holds (into ``result.one_sided``): the
    other side recorded the call but nothing under this name, and no positional input of
    ``partners`` can be it."""
    calls = {_call_of(o) for o in other}
    names = {(_call_of(o), o.name) for o in other}
    # a keyword input whose call holds an unpaired positional input (``args.N``) among
    # ``partners`` is that input passed by position there (the by-order pass pairs them)
    positional = {_call_of(r) for r in partners if r.name.startswith("args.")}
    out = []
    for rec in left:
        alone = (
            rec.role in _CALL_IO
            and bool(rec.name)
            and _call_of(rec) in calls
            and (_call_of(rec), rec.name) not in names
            and (_kwarg(rec.name) is not None or rec.name.startswith("output"))
        )
        if alone and not (_kwarg(rec.name) is not None and _call_of(rec) in positional):
            result.one_sided.append((side, rec))
        else:
            out.append(rec)
    return out


def _contradict(g: Record, a: Record) -> bool:
    """Two records under one key whose names say they are different inputs (two keywords).

    Outputs under one key are the same position of what the call returned (a tuple
    on one side, a ``ModelOutput`` on the other): paired.
    """
    if g.role not in _CALL_IO or g.name == a.name:
        return False
    gk, ak = _kwarg(g.name), _kwarg(a.name)
    return gk is not None and ak is not None and gk != ak


def parent_module(module: str) -> str:
    """Return the qualified name of ``module``'s parent (``root`` for top-level modules)."""
    if module == "root" or "." not in module:
        return "root"
    return module.rsplit(".", 1)[0]


def _group(rec: Record) -> tuple[str, str, str]:
    return parent_module(rec.module), rec.phase, rec.role


def align(golden: list[Record], actual: list[Record], renamer: Renamer | None = None) -> Alignment:
    """Pair ``golden`` and ``actual`` records of one rank and step.

    Module names are first brought to one spelling by ``renamer`` (default: wrapper
    prefixes stripped). Pairs come back in golden execution order (``seq``).

    >>> a = align(golden_records, actual_records)     # doctest: +SKIP
    >>> [(g.key, x.key) for g, x in a.pairs][:1]       # doctest: +SKIP
    [('model.embed_tokens.0.forward.param.0', 'model.embed_tokens.0.forward.param.0')]
    """
    renamer = renamer or Renamer()
    golden, actual = renamer.records(golden), renamer.records(actual)
    result = Alignment()
    used: set[int] = set()
    # call inputs/outputs by (call, name) where both sides named them (older recordings
    # did not); then by key where the names do not contradict: parameters, gradients, an
    # input passed by position on one side and by keyword on the other
    named = _named_io(golden) and _named_io(actual)
    left_golden = _pair_on(golden, actual, result, used, _named) if named else golden
    left_actual = [a for a in actual if id(a) not in used]
    left_golden = _pair_on(left_golden, left_actual, result, used, lambda r: r.key)
    left_actual = [a for a in left_actual if id(a) not in used]
    if named:  # one-sided records go to result.one_sided
        left_golden = _not_one_sided(left_golden, actual, left_actual, "golden", result)
        left_actual = _not_one_sided(left_actual, golden, left_golden, "actual", result)
    if left_golden and left_actual:
        pending: dict[tuple[str, str, str], list[Record]] = defaultdict(list)
        for a in left_actual:
            pending[_group(a)].append(a)
        still_golden = []
        for g in left_golden:
            candidates = pending.get(_group(g), [])
            partner = _pick(g, candidates)
            if partner is None:
                still_golden.append(g)
            else:
                candidates.remove(partner)
                result.pairs.append((g, partner))
        left_golden = still_golden
        left_actual = [a for group in pending.values() for a in group]
    result.pairs.sort(key=lambda pair: pair[0].seq)
    result.golden_only = sorted(left_golden, key=lambda r: r.seq)
    result.actual_only = sorted(left_actual, key=lambda r: r.seq)
    result.one_sided.sort(key=lambda sr: (sr[0] != "golden", sr[1].seq))
    return result


def _pick(golden: Record, candidates: list[Record]) -> Record | None:
    """The first candidate (in execution order) of the same shape, same dtype preferred."""
    same_shape = [c for c in candidates if c.shape == golden.shape]
    same_dtype = [c for c in same_shape if c.dtype == golden.dtype]
    return (same_dtype or same_shape or [None])[0]


class InOrder(Sequence[tuple[Record, Record]]):
    """The pairs of two steps that recorded the same records in the same order: the i-th
    golden record with the i-th actual one, read when used (``StepRecords`` keeps a big
    step's records in their files, not in memory)."""

    __slots__ = ("actual", "golden")

    def __init__(self, golden: Sequence[Record], actual: Sequence[Record]) -> None:
        self.golden = golden
        self.actual = actual

    def __len__(self) -> int:
        return len(self.golden)

    @overload
    def __getitem__(self, index: int) -> tuple[Record, Record]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[Record, Record]]: ...

    def __getitem__(
        self, index: int | slice
    ) -> tuple[Record, Record] | list[tuple[Record, Record]]:
        if isinstance(index, slice):
            return list(zip(self.golden[index], self.actual[index], strict=True))
        return self.golden[index], self.actual[index]

    def __iter__(self) -> Iterator[tuple[Record, Record]]:
        return zip(self.golden, self.actual, strict=True)


def pairs_in_order(golden: Record, actual: Record) -> bool:
    """Whether :func:`align` pairs ``golden`` with ``actual`` as they stand when both steps
    hold the same keys (and call names) once each, in the same order: the same key, module
    and name, no wrapper's record, and no wrapper in the name (nothing to rename; the
    renamer has no ``--map`` rules)."""
    if golden.key != actual.key or golden.module != actual.module:
        return False
    if golden.role in _CALL_IO and golden.name != actual.name:
        return False
    if golden.module_type in WRAPPER_TYPES or actual.module_type in WRAPPER_TYPES:
        return False
    return not any(part in WRAPPER_SEGMENTS for part in golden.module.split("."))
