"""The package's layering, read from what runs: no cycle, no upward import, no private reach.

A contributor should be able to read the direction of dependencies off the
code. These tests build the import graph of ``src/precguard`` from the source
with :mod:`ast` and see every way one module makes another run:

* ``import`` and ``from ... import`` at module level *and* inside functions
  (a deferred import is still a dependency), relative imports resolved;
* the parent packages an import runs: ``from precguard.compare.metrics import
  x`` executes ``precguard/compare/__init__.py`` first, so it depends on
  whatever that ``__init__`` imports;
* the lazy top-level API: ``from precguard import compare_runs`` is an import
  of the module ``precguard.__init__``'s ``_EXPORTS`` names for it;
* modules named by string: a constant ``"precguard.backends.cpu"`` (the
  plugin manager's built-in list) and an f-string ``f"precguard.checks.{x}"``
  (every module under ``precguard.checks``), as ``importlib`` would load them.

Imports under ``if TYPE_CHECKING:`` never run, but they are dependencies all the
same (a type checker, a reader, a refactoring follows them), so they are edges of
the graph the rules check: no cycle and no upward import, annotations included. The
one exception is the root package's annotations of its lazy exports (the public
API's listing for type checkers), which take no part in the direction rule.

The plugin manager loads its built-in plugins by name exactly as it loads
third-party entry points: that is the plugin mechanism's one inversion (the
plugin imports the registry's marker, the registry loads the plugin). Those
edges are seen and checked separately: the module must exist and sit above
the registry; they take no part in the cycle and direction rules.
"""

from __future__ import annotations

import ast
import copy
import functools
from dataclasses import dataclass
from pathlib import Path

import pytest

import precguard

SRC = Path(precguard.__file__).resolve().parent.parent
PACKAGE = "precguard"
#: the module whose string constants name the plugins it loads (see the module docstring)
REGISTRY = "precguard.plugins"


@dataclass(frozen=True)
class Import:
    """One import statement's target as written: ``module`` and the ``name`` taken from it."""

    importer: str
    module: str
    name: str | None
    line: int
    type_checking: bool = False
    by_string: bool = False


def _modules(src: Path = SRC) -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its ``__init__.py``)."""
    found: dict[str, Path] = {}
    for path in sorted((src / PACKAGE).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            found.add(id(first.value))
    return found


def _imports(name: str, path: Path) -> list[Import]:
    """The imports of one module, wherever they stand; ``type_checking`` marks annotation-only."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                guarded.update(id(n) for n in ast.walk(stmt))
    docs = _docstrings(tree)
    found: list[Import] = []
    for node in ast.walk(tree):
        tc = id(node) in guarded
        if isinstance(node, ast.Import):
            found += [Import(name, a.name, None, node.lineno, tc) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # "from . import x" in a package is relative to the package itself
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [Import(name, module, a.name, node.lineno, tc) for a in node.names]
        elif name != PACKAGE and isinstance(node, ast.Constant) and id(node) not in docs:
            # a module named by string (importlib.import_module, a plugin list)
            if isinstance(node.value, str) and node.value.startswith(PACKAGE + "."):
                found.append(Import(name, node.value, None, node.lineno, tc, by_string=True))
        elif name != PACKAGE and isinstance(node, ast.JoinedStr) and node.values:
            head = node.values[0]
            if (
                isinstance(head, ast.Constant)
                and isinstance(head.value, str)
                and head.value.startswith(PACKAGE + ".")
                and head.value.endswith(".")
            ):
                # f"precguard.checks.{family}": any module under that package
                found.append(Import(name, head.value + "*", None, node.lineno, tc, by_string=True))
    return [i for i in found if i.module == PACKAGE or i.module.startswith(PACKAGE + ".")]


def _lazy_exports(modules: dict[str, Path]) -> dict[str, str]:
    """``precguard.__init__``'s ``_EXPORTS``: public name -> the module that defines it."""
    tree = ast.parse(modules[PACKAGE].read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        target = getattr(node, "target", None) or next(iter(getattr(node, "targets", [])), None)
        if isinstance(target, ast.Name) and target.id == "_EXPORTS":
            value = ast.literal_eval(node.value)  # type: ignore[attr-defined]
            return {str(k): str(v) for k, v in value.items()}
    return {}


def _targets(imp: Import, modules: dict[str, Path], lazy: dict[str, str]) -> set[str]:
    """The project modules one import makes run (a named submodule, a lazy export's module)."""
    if imp.module.endswith(".*"):
        prefix = imp.module[:-1]
        return {m for m in modules if m.startswith(prefix)}
    if imp.by_string:
        return {imp.module} if imp.module in modules else set()
    if imp.name is not None and f"{imp.module}.{imp.name}" in modules:
        return {f"{imp.module}.{imp.name}"}
    if imp.module == PACKAGE and imp.name in lazy:
        return {lazy[imp.name]}
    module = imp.module
    while module and module not in modules:
        module = module.rpartition(".")[0]
    return {module} if module else set()


def _with_parents(target: str, importer: str, modules: dict[str, Path]) -> set[str]:
    """``target`` and the parent packages importing it runs (not the importer's own, nor the
    root, whose ``__init__`` imports nothing at run time)."""
    found = {target}
    parts = target.split(".")
    for n in range(2, len(parts)):
        parent = ".".join(parts[:n])
        if parent in modules and not (importer + ".").startswith(parent + "."):
            found.add(parent)
    return found


@dataclass
class Graph:
    """The package's edges: ``runs`` (what executes), ``annotations`` (TYPE_CHECKING only),
    ``plugins`` (loaded by name by the registry)."""

    runs: dict[str, set[str]]
    annotations: dict[str, set[str]]
    plugins: dict[str, set[str]]
    missing: list[str]


def build_graph(src: Path = SRC) -> Graph:
    """The import graph of the package under ``src`` (the real package's is built once)."""
    if src == SRC:
        return _package_graph()
    return _build_graph(src)


@functools.cache
def _package_graph() -> Graph:
    return _build_graph(SRC)


def _build_graph(src: Path) -> Graph:
    modules = _modules(src)
    lazy = _lazy_exports(modules) if PACKAGE in modules else {}
    graph = Graph({m: set() for m in modules}, {m: set() for m in modules}, {}, [])
    for name, path in modules.items():
        for imp in _imports(name, path):
            found = _targets(imp, modules, lazy)
            if imp.by_string and not found:
                if name == REGISTRY:
                    graph.missing.append(f"{name}:{imp.line}: no module {imp.module}")
                continue
            if imp.by_string and name == REGISTRY:
                graph.plugins.setdefault(name, set()).update(found)
                continue
            edges = set().union(*(_with_parents(t, name, modules) for t in found))
            # the importer's own packages ran before it (resources.files of its package)
            edges = {e for e in edges if not (name + ".").startswith(e + ".")}
            (graph.annotations if imp.type_checking else graph.runs)[name].update(edges)
    return graph


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the project modules it makes run (a copy: callers may change it)."""
    return copy.deepcopy(build_graph(src).runs)


def dependency_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the project modules it depends on: what it makes run and what it imports
    under ``TYPE_CHECKING`` (a new graph: callers may change it)."""
    graph = build_graph(src)
    return {m: graph.runs[m] | graph.annotations[m] for m in graph.runs}


def directed_graph(src: Path = SRC) -> dict[str, set[str]]:
    """:func:`dependency_graph` without the root package's annotations of its lazy exports
    (the public API listed for type checkers; at run time the root imports nothing)."""
    graph = build_graph(src)
    return {
        m: graph.runs[m] | (graph.annotations[m] if m != PACKAGE else set()) for m in graph.runs
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, successors = work[-1]
            advanced = False
            for succ in successors:
                if succ not in index:
                    index[succ] = low[succ] = counter
                    counter += 1
                    stack.append(succ)
                    on_stack.add(succ)
                    work.append((succ, iter(sorted(graph.get(succ, ())))))
                    advanced = True
                    break
                if succ in on_stack:
                    low[node] = min(low[node], index[succ])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _describe(component: list[str], graph: dict[str, set[str]]) -> str:
    members = set(component)
    return "; ".join(
        f"{m} -> {', '.join(sorted(graph[m] & members))}" for m in component if graph[m] & members
    )


def _unit(module: str) -> str:
    """The subpackage a module belongs to: ``precguard.compare.engine`` -> ``precguard.compare``.

    A top-level module (``precguard.runner``) is a unit of its own; so is the root package.
    """
    return ".".join(module.split(".")[:2])


def unit_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Unit -> the other units its modules import."""
    units: dict[str, set[str]] = {}
    for module, targets in graph.items():
        entry = module.endswith("__main__")  # python -m precguard.compare: the CLI's entry
        units.setdefault(_unit(module), set()).update(
            _unit(t)
            for t in targets
            if _unit(t) != _unit(module) and not (entry and _unit(t) == "precguard.cli")
        )
    return units


#: every unit's layer, bottom first: a unit imports only units of lower layers (and itself).
#: A new unit must be placed here (the test fails until it is).
LAYERS: tuple[frozenset[str], ...] = tuple(
    frozenset(PACKAGE if u == "." else f"{PACKAGE}.{u}" for u in layer.split())
    for layer in (
        # the root package (".": only __version__ and lazy exports) and the package's helpers;
        # the chunked sums of two tensors' difference (the numerics core's measure reads them)
        ". _logging errors text suggest difference",
        # pure helpers over torch: the tree walker, the Backend class, what a check is and
        # returns (checkspec: Check, Finding), the hand-written models of the built-in
        # targets, the numerics core (rounding floor, reduction length, measure, status
        # ladder, thresholds) every judge of error asks
        "tree backend checkspec models numerics",
        # the hook specs, which name the Backend, the Switch and the Check they register
        "hookspecs",
        # the plugin registry
        "plugins",
        # built-in backend plugins (the registry loads them whenever a device is asked for,
        # capture included: they import nothing of capture); the recording format; targets
        "backends dump target",
        # device services; capture; the recordings of other tools; rank facts; the oracle
        "devices capture interop ranks oracle targets",
        # one target set up on a device
        "target_run",
        # what records, judges and sweeps: record, compare, op-check, op graphs
        "runner compare opcheck graph",
        # the CI guard's goldens and margins (read by the JUnit renderer)
        "guard",
        # what builds on compare: layouts, replay and bisect, the report models and renderers
        "layout localize report",
        # the checks, the checklist that runs them, the demo
        "checks",
        "checklist demo",
        # the workflows built on all of the above: generate-diff, the training monitor,
        # assert_matches_golden; then the pytest plugin that wires it into pytest
        "generation training testing",
        "pytest_plugin",
        "cli",
        "__main__",
    )
)

#: a unit's layer index
RANK: dict[str, int] = {unit: i for i, layer in enumerate(LAYERS) for unit in layer}

#: module -> units it may import against the layers, and why (the exception is the TODO)
#: (none left: issue 18's compare restructure moved the layout branch of compare into
#: layout/compare.py and the msprobe name rule out of compare/engine.py)
KNOWN_EXCEPTIONS: dict[str, frozenset[str]] = {}

#: module -> the only modules of its unit allowed to import the given unit
ONLY_FROM: dict[str, frozenset[str]] = {
    # capture's recording and hooks know no plugin manager: the public entry points hand
    # them ``to_host`` and the fingerprint lookup
    "precguard.plugins": frozenset({"precguard.capture.api"}),
}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports of a unit in the same or a higher layer, units without a layer, and the CLI."""
    found = []
    for module, targets in sorted(graph.items()):
        unit = _unit(module)
        if unit not in RANK:
            found.append(f"{unit} has no layer in LAYERS")
            continue
        for target in sorted(targets):
            other = _unit(target)
            if other == unit:
                continue
            if other == "precguard.cli" and module.endswith("__main__"):
                continue  # an entry point: python -m ...
            if other not in RANK:
                continue  # reported once for that unit
            if other in KNOWN_EXCEPTIONS.get(module, ()):
                continue
            if RANK[other] >= RANK[unit]:
                found.append(f"{module} -> {target}")
            allowed = ONLY_FROM.get(other)
            if allowed is not None and unit == "precguard.capture" and module not in allowed:
                found.append(f"{module} -> {target} (only {', '.join(sorted(allowed))})")
    return found


def _without_known_exceptions(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    return {
        m: {t for t in ts if _unit(t) not in KNOWN_EXCEPTIONS.get(m, ())} for m, ts in graph.items()
    }


def test_the_package_has_no_import_cycle_even_through_annotations() -> None:
    """No module depends on itself, whether the loop runs or passes through a
    ``TYPE_CHECKING`` import (``checks/base -> target_run -> devices -> plugins ->
    hookspecs -> checks/base`` was one: the hook specs now name ``checkspec.Check``)."""
    graph = _without_known_exceptions(dependency_graph())
    assert len(graph) > 50, "the graph must cover the whole package"
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_describe(c, graph) for c in found)


def test_no_cycle_between_subpackages_even_through_annotations() -> None:
    units = unit_graph(_without_known_exceptions(dependency_graph()))
    found = cycles(units)
    assert not found, "cycles between subpackages:\n" + "\n".join(
        _describe(c, units) for c in found
    )


def test_lower_layers_do_not_import_upper_ones_even_for_annotations() -> None:
    violations = layer_violations(directed_graph())
    assert not violations, "imports against the layering:\n" + "\n".join(violations)


def test_every_unit_has_a_layer() -> None:
    units = {_unit(m) for m in import_graph()}
    assert units <= set(RANK), f"place these in LAYERS: {sorted(units - set(RANK))}"
    assert not set(RANK) - units - {PACKAGE}, f"LAYERS names no such unit: {set(RANK) - units}"


def test_the_registrys_built_in_plugins_exist_and_sit_above_it() -> None:
    graph = build_graph()
    assert not graph.missing, graph.missing
    loaded = graph.plugins.get(REGISTRY, set())
    assert {"precguard.backends.cpu", "precguard.backends.emu", "precguard.checks.builtin"} <= (
        loaded
    )
    assert all(RANK[_unit(m)] > RANK[_unit(REGISTRY)] for m in loaded), loaded


def test_the_known_exceptions_are_still_needed() -> None:
    """An exception the code no longer needs is removed from the list, not left to rot."""
    graph = import_graph()
    for module, allowed in KNOWN_EXCEPTIONS.items():
        for unit in allowed:
            assert any(_unit(t) == unit for t in graph.get(module, ())), (module, unit)


def _private_owner(dotted: str) -> str | None:
    """The unit a dotted name is private to, or None when it is public.

    A component after the unit that starts with one underscore (``_lab``,
    ``_gather``; not a dunder) makes the name private to its unit. A private
    unit (``precguard._logging``) is the package's own helper and may be used
    throughout the package.
    """
    parts = dotted.split(".")
    for part in parts[2:]:
        if part.startswith("_") and not part.startswith("__"):
            return _unit(dotted)
    return None


# -- the checkers themselves must be able to fail: one planted example per blind spot --------


def _write(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        path = root / PACKAGE / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_a_function_level_relative_import_closing_a_loop_is_a_cycle(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": "def f():\n    from .high import g\n    return g\n",
            "high.py": "from precguard import low\n",
            "sub/__init__.py": "",
            "sub/a.py": "from ..low import f\n",
        },
    )
    graph = import_graph(src)
    assert graph["precguard.low"] == {"precguard.high"}
    assert graph["precguard.sub.a"] == {"precguard.low"}
    assert cycles(graph) == [["precguard.high", "precguard.low"]]


def test_a_parent_package_init_closes_a_cycle(tmp_path: Path) -> None:
    """layout/attribute imports compare.metrics; compare/__init__ imports runs; runs imports
    layout: the loop runs through compare's __init__, which a module-only graph misses."""
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "compare/__init__.py": "from precguard.compare.runs import compare_runs\n",
            "compare/metrics.py": "",
            "compare/runs.py": "def compare_runs():\n    from precguard.layout import view\n",
            "layout/__init__.py": "",
            "layout/view.py": "from precguard.layout import attribute\n",
            "layout/attribute.py": "from precguard.compare.metrics import x\n",
        },
    )
    graph = import_graph(src)
    assert "precguard.compare" in graph["precguard.layout.attribute"]
    assert cycles(graph), graph
    assert cycles(unit_graph(graph)) == [["precguard.compare", "precguard.layout"]]


def test_a_lazy_top_level_export_is_an_edge(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "__init__.py": '_EXPORTS = {"compare_runs": "precguard.compare.runs"}\n',
            "compare/__init__.py": "",
            "compare/runs.py": "from precguard.dump import reader\n",
            "dump/__init__.py": "",
            "dump/reader.py": "def f():\n    from precguard import compare_runs\n",
        },
    )
    graph = import_graph(src)
    assert "precguard.compare.runs" in graph["precguard.dump.reader"]
    assert cycles(graph)


def test_modules_named_by_string_are_edges(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": (
                "import importlib\n"
                "def f(x):\n"
                "    importlib.import_module('precguard.high')\n"
                "    return importlib.import_module(f'precguard.fam.{x}')\n"
            ),
            "high.py": "",
            "fam/__init__.py": "",
            "fam/a.py": "from precguard import low\n",
        },
    )
    graph = import_graph(src)
    assert {"precguard.high", "precguard.fam.a", "precguard.fam"} <= graph["precguard.low"]
    assert cycles(graph) == [["precguard.fam.a", "precguard.low"]]


def test_a_docstring_naming_a_module_is_no_edge(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {"__init__.py": "", "low.py": '"""See precguard.high."""\n', "high.py": ""},
    )
    assert import_graph(src)["precguard.low"] == set()


def test_a_type_checking_import_runs_nothing_but_closes_a_cycle(tmp_path: Path) -> None:
    """The shape of the old checks/base -> ... -> hookspecs -> checks/base loop: every leg
    runs but the last, an annotation's."""
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "specs.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from precguard.checks.base import Check\n"
            ),
            "registry.py": "from precguard import specs\n",
            "checks/__init__.py": "",
            "checks/base.py": "def f():\n    from precguard import registry\n",
        },
    )
    graph = build_graph(src)
    assert cycles(graph.runs) == []
    assert cycles(dependency_graph(src)) == [
        ["precguard.checks.base", "precguard.registry", "precguard.specs"]
    ]


def test_the_root_package_s_annotations_are_no_upward_import(tmp_path: Path) -> None:
    """The root lists its lazy exports for type checkers; any other module's annotation of
    an upper layer is a violation."""
    src = _write(
        tmp_path,
        {
            "__init__.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from precguard.cli import main\n"
            ),
            "errors.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n"
                "    from precguard.cli import main\n"
            ),
            "cli/__init__.py": "",
        },
    )
    assert layer_violations(directed_graph(src)) == ["precguard.errors -> precguard.cli"]


def test_an_upward_import_is_a_layer_violation() -> None:
    graph = {"precguard.dump.writer": {"precguard.compare.engine"}, "precguard.compare.x": set()}
    assert layer_violations(graph) == ["precguard.dump.writer -> precguard.compare.engine"]


def test_importing_a_peer_of_the_same_layer_is_a_violation() -> None:
    graph = {"precguard.runner": {"precguard.opcheck.sweep"}}
    assert layer_violations(graph) == ["precguard.runner -> precguard.opcheck.sweep"]


def test_a_unit_without_a_layer_is_reported() -> None:
    assert layer_violations({"precguard.newthing.a": {"precguard.errors"}}) == [
        "precguard.newthing has no layer in LAYERS"
    ]


def test_capture_below_the_api_importing_the_registry_is_a_violation() -> None:
    graph = {"precguard.capture.recording": {"precguard.plugins"}}
    assert layer_violations(graph) == [
        "precguard.capture.recording -> precguard.plugins (only precguard.capture.api)"
    ]


def test_a_missing_built_in_plugin_is_reported(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {"__init__.py": "", "plugins.py": 'DEFAULT = ("precguard.backends.nope",)\n'},
    )
    assert build_graph(src).missing == ["precguard.plugins:1: no module precguard.backends.nope"]


def private_imports(src: Path = SRC) -> list[str]:
    """Every import of a name or module private to another subpackage, as ``where: what``."""
    modules = _modules(src)
    offences = []
    for name, path in modules.items():
        for imp in _imports(name, path):
            if imp.by_string:
                continue
            dotted = imp.module if imp.name is None else f"{imp.module}.{imp.name}"
            owner = _private_owner(dotted)
            if owner is not None and owner != _unit(name):
                offences.append(f"{path.relative_to(src)}:{imp.line}: {dotted}")
    return offences


def test_no_module_imports_another_subpackages_private_name() -> None:
    offences = private_imports()
    assert not offences, "private names used across subpackages:\n" + "\n".join(offences)


@pytest.mark.parametrize(
    ("importer", "text", "offends"),
    [
        ("cli/x.py", "from precguard.checks._lab import lab\n", True),
        ("cli/x.py", "from precguard.plugins import _sources\n", True),
        ("cli/x.py", "import precguard.checks._lab\n", True),
        ("checks/x.py", "from precguard.checks._lab import lab\n", False),
        ("checks/x.py", "from ._lab import lab\n", False),
        ("cli/x.py", "from precguard._logging import get_logger\n", False),
        ("cli/x.py", "from precguard.checks.base import Finding\n", False),
    ],
)
def test_private_names_are_found_across_subpackages(
    tmp_path: Path, importer: str, text: str, offends: bool
) -> None:
    src = _write(
        tmp_path,
        {"__init__.py": "", "cli/__init__.py": "", "checks/__init__.py": "", importer: text},
    )
    assert bool(private_imports(src)) is offends
