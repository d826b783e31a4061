"""Turn one msprobe ``dump.json`` into precguard records, in precguard's capture order.

msprobe writes a call's entry when the call *ends* (its inputs and outputs
together), so ``dump.json`` lists a parent module after its children.
precguard records a module's inputs when it starts and its outputs when it
ends; the start order is rebuilt from ``construct.json`` (which call ran inside
which), else from module paths, so that ``seq`` means the same on both sides:
a parent's inputs, then its children, then its outputs.

Mapping (see docs/msprobe.md):

========================================  ===========================================
msprobe                                   precguard record
========================================  ===========================================
``Module.{p}.{C}.forward.{n}``            module ``{p}``, call ``n``, phase forward
  ``input_args`` then ``input_kwargs``    role ``input``, index = tensor position
  ``parameters``                          role ``param`` (name = parameter name)
  ``output``                              role ``output``
``Module.{p}.{C}.backward.{n}``           phase backward:
  ``input`` (gradient of the outputs)     role ``output``
  ``output`` (gradient of the inputs)     role ``input``
``Module.{p}.{C}.parameters_grad``        role ``grad``, phase backward
``{F}.{api}.{k}.{forward|backward}``      module ``msprobe_api.{F}.{api}``; call = the
                                          k-th call of that API *within the step*
========================================  ===========================================

Statistics: ``Max``/``Min``/``Mean``/``Norm`` become ``max``/``min``/``mean``/
``l2``; ``absmax`` is ``max(|Max|, |Min|)``; what msprobe does not measure
(``std``, NaN/Inf/zero counts) stays None.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from precguard._logging import get_logger
from precguard.dump.untrusted import read_json_file
from precguard.errors import DumpFormatError
from precguard.interop.msprobe.layout import RankDump
from precguard.interop.msprobe.names import MsprobeName, parse_name
from precguard.interop.msprobe.tensors import SUFFIXES
from precguard.text import shown

logger = get_logger(__name__)

#: a dump.json larger than this is refused (msprobe's statistics are ~300 bytes a tensor)
MAX_DUMP_JSON_BYTES = 2 * 1024 * 1024 * 1024
#: construct.json holds one short line per call
MAX_CONSTRUCT_BYTES = 512 * 1024 * 1024
#: deepest nesting of tuples/dicts inside one call's arguments that is walked
MAX_DEPTH = 8
#: the msprobe tasks whose dumps hold per-tensor records
TASKS = ("statistics", "tensor")


@dataclass
class TensorFile:
    """A tensor file named by a record: where it is and what it must hold."""

    path: Path
    shown_path: str


@dataclass
class Converted:
    """The records of one rank and step, ready for the writer (``seq`` not yet given)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    #: record index -> the tensor file it names
    tensors: dict[int, TensorFile] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)
    skipped: Counter[str] = field(default_factory=Counter)


def read_rank_dump(root: Path, dump: RankDump) -> Converted:
    """Read ``dump.json`` (and ``construct.json``) of one rank folder into precguard records.

    :raises DumpFormatError: the file is not a pytorch msprobe statistics/tensor dump,
        or an entry is malformed (the message names the file and the entry).
    """
    where = shown(root / dump.rel / "dump.json")
    raw = read_json_file(
        dump.member(root, "dump.json", what="msprobe dump"),
        limit=MAX_DUMP_JSON_BYTES,
        what="msprobe dump.json",
    )
    if not isinstance(raw, dict) or not isinstance(raw.get("data"), dict):
        raise DumpFormatError(f"{where}: not an msprobe dump.json (no 'data' object)")
    framework = raw.get("framework", "pytorch")
    if framework != "pytorch":
        raise DumpFormatError(
            f"{where}: a {shown(repr(framework), 30)} dump; only msprobe's PyTorch dumps are read"
        )
    task = raw.get("task")
    if task not in TASKS:
        raise DumpFormatError(
            f"{where}: task {shown(repr(task), 30)}; only 'statistics' and 'tensor' dumps hold "
            "per-tensor records"
        )
    out = Converted(meta={"task": task, "level": raw.get("level")})
    parents = _read_construct(root, dump)
    entries = [(name, body) for name, body in raw["data"].items()]
    builder = _Builder(root, dump, where, out)
    for name, body in _capture_order(entries, parents, shown(root / dump.rel / "construct.json")):
        builder.add(name, body)
    return out


def _read_construct(root: Path, dump: RankDump) -> dict[str, str | None] | None:
    path = dump.member(root, "construct.json", what="msprobe construct.json")
    if not path.is_file():
        return None
    raw = read_json_file(path, limit=MAX_CONSTRUCT_BYTES, what="msprobe construct.json")
    if not isinstance(raw, dict) or not all(v is None or isinstance(v, str) for v in raw.values()):
        raise DumpFormatError(
            f"{shown(root / dump.rel / 'construct.json')}: expected an object of call name -> "
            "parent call name or null"
        )
    return raw


@dataclass
class _Node:
    name: str
    body: Any
    parsed: MsprobeName | None
    children: list[_Node] = field(default_factory=list)


def _capture_order(
    entries: list[tuple[str, Any]], parents: dict[str, str | None] | None, where: str
) -> Iterator[tuple[str, Any]]:
    """Yield ``(name, body)`` in precguard's capture order.

    Runs of consecutive forward entries are rebuilt into their call tree and
    yielded as a start event (``_Start``: inputs, parameters) and an end event
    (``_End``: outputs) per call; backward entries keep their place in the file.
    """
    run: list[_Node] = []
    for name, body in entries:
        parsed = parse_name(name)
        if parsed is not None and parsed.kind != "param_grad" and parsed.phase == "forward":
            run.append(_Node(name, body, parsed))
            continue
        yield from _tour(run, parents, where)
        run = []
        yield name, body
    yield from _tour(run, parents, where)


def _tour(
    run: list[_Node], parents: dict[str, str | None] | None, where: str
) -> Iterator[tuple[str, Any]]:
    """The forward calls of ``run`` (in end order) as start/end events in start order.

    :raises DumpFormatError: ``construct.json`` makes calls each other's parents (a
        cycle), which would leave them out of the tree.
    """
    if not run:
        return
    roots: list[_Node] = []
    if parents:
        by_name = {n.name: n for n in run}
        for node in run:  # end order: children are appended in the order they ran
            parent = by_name.get(parents.get(node.name) or "")
            (parent.children if parent is not None and parent is not node else roots).append(node)
    else:
        # no construct.json: a module's children are the calls that ended just before
        # it and lie under its path
        pending: list[_Node] = []
        for node in run:
            prefix = "" if node.parsed is None else node.parsed.module + "."
            if node.parsed is not None and node.parsed.kind == "module":
                cut = len(pending)
                while cut > 0:
                    cand = pending[cut - 1].parsed
                    under = cand is not None and (
                        node.parsed.module == "root" or cand.module.startswith(prefix)
                    )
                    if not under:
                        break
                    cut -= 1
                # the children move out of pending in place: slicing pending whole per
                # call made an import of N calls take O(N^2) (100k calls: a minute)
                node.children = pending[cut:]
                del pending[cut:]
            pending.append(node)
        roots = pending
    stack: list[tuple[_Node, bool]] = [(n, False) for n in reversed(roots)]
    seen: set[int] = set()
    while stack:
        node, done = stack.pop()
        if done:
            yield node.name, _End(node.body)
            continue
        if id(node) in seen:  # a cycle in a hostile construct.json: visit once
            continue
        seen.add(id(node))
        yield node.name, _Start(node.body)
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(node.children))
    if len(seen) != len(run):
        raise DumpFormatError(
            f"{where}: {len(run) - len(seen)} calls are their own ancestors (a cycle of "
            "parents); not a call tree msprobe writes"
        )


@dataclass
class _Start:
    body: Any


@dataclass
class _End:
    body: Any


class _Builder:
    """Builds precguard record dicts from msprobe entries, one rank and step."""

    def __init__(self, root: Path, dump: RankDump, where: str, out: Converted) -> None:
        self.root = root
        self.dump = dump
        self.where = where
        self.out = out
        #: API calls are counted per step: msprobe counts them over the whole process
        self.api_calls: dict[tuple[str, str], dict[int, int]] = defaultdict(dict)

    def add(self, name: str, body: Any) -> None:
        parsed = parse_name(name)
        if parsed is None:
            self.out.skipped[name.split(".", 1)[0]] += 1
            return
        part: str | None = None
        if isinstance(body, _Start):
            body, part = body.body, "start"
        elif isinstance(body, _End):
            body, part = body.body, "end"
        if not isinstance(body, dict):
            raise DumpFormatError(f"{self.where}: entry {shown(name, 100)} is not a JSON object")
        call = self._call(parsed)
        what = f"entry {shown(name, 100)}"
        if parsed.kind == "param_grad":
            for i, (pname, value) in enumerate(body.items()):
                values = value if isinstance(value, list) else [value]
                for v in values:
                    self._leaf(parsed, call, "grad", i, str(pname), v, what)
            return
        if parsed.phase == "forward":
            if part in (None, "start"):
                args = _list(body.get("input_args", []), f"{what} input_args", self.where)
                kwargs = body.get("input_kwargs", {})
                if not isinstance(kwargs, dict):
                    raise DumpFormatError(f"{self.where}: {what}: input_kwargs is not an object")
                leaves = list(_leaves(args, "args", 0)) + list(_leaves(kwargs, "kwargs", 0))
                self._role(parsed, call, "input", leaves, what)
                params = body.get("parameters", {})
                if isinstance(params, dict):
                    self._role(
                        parsed, call, "param", [(str(k), v) for k, v in params.items()], what
                    )
            if part in (None, "end"):
                outputs = _list(body.get("output", []), f"{what} output", self.where)
                self._role(parsed, call, "output", list(_leaves(outputs, "output", 0)), what)
            return
        # backward: msprobe's "input" is what flows into the backward call (the gradient
        # of the module's outputs), its "output" the gradient of the module's inputs
        grad_out = _list(body.get("input", []), f"{what} input", self.where)
        grad_in = _list(body.get("output", []), f"{what} output", self.where)
        self._role(parsed, call, "output", list(_leaves(grad_out, "output", 0)), what)
        self._role(parsed, call, "input", list(_leaves(grad_in, "args", 0)), what)

    def _call(self, parsed: MsprobeName) -> int:
        if parsed.kind != "api":
            return parsed.count
        seen = self.api_calls[(parsed.module, parsed.phase)]
        return seen.setdefault(parsed.count, len(seen))

    def _role(
        self,
        parsed: MsprobeName,
        call: int,
        role: str,
        leaves: list[tuple[str, Any]],
        what: str,
    ) -> None:
        index = 0
        for name, leaf in leaves:
            if self._leaf(parsed, call, role, index, name, leaf, what):
                index += 1

    def _leaf(
        self,
        parsed: MsprobeName,
        call: int,
        role: str,
        index: int,
        name: str,
        leaf: Any,
        what: str,
    ) -> bool:
        """Add one record if ``leaf`` describes a tensor; return whether it did."""
        if not _is_tensor(leaf):
            return False
        where = f"{self.where}: {what} {name}"
        dtype = _dtype(leaf["dtype"], where)
        shape = _shape(leaf.get("shape"), where)
        key = f"{parsed.module}.{call}.{parsed.phase}.{role}.{index}"
        record: dict[str, Any] = {
            "key": key,
            "module": parsed.module,
            "module_type": parsed.module_type,
            "call": call,
            "phase": parsed.phase,
            "role": role,
            "index": index,
            "name": name,
            "step": self.dump.step,
            "rank": self.dump.rank,
            "dtype": dtype,
            "shape": shape,
            "stats": _stats(leaf, dtype, shape, where),
        }
        data_name = leaf.get("data_name")
        if data_name is not None:
            self.out.tensors[len(self.out.records)] = self._tensor_file(data_name, where)
        self.out.records.append(record)
        return True

    def _tensor_file(self, data_name: Any, where: str) -> TensorFile:
        if not isinstance(data_name, str) or "/" in data_name or "\\" in data_name:
            raise DumpFormatError(
                f"{where}: data_name {shown(repr(data_name), 80)} is not a plain file name"
            )
        suffix = Path(data_name).suffix
        if suffix not in SUFFIXES:
            raise DumpFormatError(
                f"{where}: tensor file {shown(data_name, 80)}: unsupported type "
                f"{shown(suffix or '(none)', 20)}; only .pt (weights_only) and .npy "
                "(allow_pickle=False) are read"
            )
        rel = f"dump_tensor_data/{data_name}"
        path = self.dump.member(self.root, rel, what=f"{where} data_name")
        return TensorFile(path, shown(self.root / self.dump.rel / rel))


def _list(value: Any, what: str, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise DumpFormatError(f"{where}: {what} is not a list")
    return value


def _is_tensor(leaf: Any) -> bool:
    return (
        isinstance(leaf, dict)
        and isinstance(leaf.get("dtype"), str)
        and leaf["dtype"].startswith("torch.")
        and "shape" in leaf
    )


def _leaves(obj: Any, path: str, depth: int) -> Iterator[tuple[str, Any]]:
    """``(path, leaf)`` for every value in msprobe's nested argument description.

    A leaf is an object with a string ``type`` (a tensor, a number, a dtype, ...);
    lists and other objects (a model output's fields) are walked, in order.
    """
    if isinstance(obj, dict) and isinstance(obj.get("type"), str):
        yield path, obj
    elif depth >= MAX_DEPTH or obj is None:
        return
    elif isinstance(obj, list):
        for i, item in enumerate(obj):
            yield from _leaves(item, f"{path}.{i}", depth + 1)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _leaves(v, f"{path}.{k}", depth + 1)


def _dtype(value: str, where: str) -> str:
    import torch

    name = value.removeprefix("torch.")
    if not isinstance(getattr(torch, name, None), torch.dtype):
        raise DumpFormatError(f"{where}: unknown dtype {shown(repr(value), 40)}")
    return name


def _shape(value: Any, where: str) -> list[int]:
    if not isinstance(value, list) or not all(type(s) is int and s >= 0 for s in value):
        raise DumpFormatError(f"{where}: shape {shown(repr(value), 60)} is not a list of sizes")
    return value


_SPECIAL = {
    "nan": math.nan,
    "inf": math.inf,
    "-inf": -math.inf,
    "infinity": math.inf,
    "-infinity": -math.inf,
}


def _number(value: Any, what: str, where: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, (int, float)):
        try:
            return float(value)
        except OverflowError:  # an integer of hundreds of digits
            raise DumpFormatError(
                f"{where}: {what} is an integer of {len(str(value))} digits, out of the "
                "range of any float"
            ) from None
    if isinstance(value, str) and value.strip().lower() in _SPECIAL:
        return _SPECIAL[value.strip().lower()]
    raise DumpFormatError(f"{where}: {what} is {shown(repr(value), 40)}, not a number")


def _stats(leaf: dict[str, Any], dtype: str, shape: list[int], where: str) -> dict[str, Any] | None:
    numel = math.prod(shape)
    hi = _number(leaf.get("Max"), "Max", where)
    lo = _number(leaf.get("Min"), "Min", where)
    if numel == 0 or hi is None or lo is None:
        return None
    mean = _number(leaf.get("Mean"), "Mean", where)
    norm = _number(leaf.get("Norm"), "Norm", where)
    absmax = math.nan if math.isnan(hi) or math.isnan(lo) else max(abs(hi), abs(lo))
    return {
        "min": lo,
        "max": hi,
        "mean": mean,
        "std": None,
        "absmax": absmax,
        "l2": norm,
        "nan": None,
        "inf": None,
        "zeros": None,
        "numel": numel,
    }
