"""The package's layering: no import cycle, no reaching into another subpackage's privates.

A contributor should be able to read the direction of dependencies off the
code (``cli`` -> API -> capture/compare/localize/checks -> dump, devices,
plugins). These tests build the import graph of ``src/precguard`` from the
source with :mod:`ast`: every ``import`` and ``from ... import`` statement,
at module level *and* inside functions (a function-level import is still a
dependency, only a deferred one), relative imports resolved against the
importing module. Imports under ``if TYPE_CHECKING:`` are left out: they never
run, and exist precisely so that annotations do not create runtime edges.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

import precguard

SRC = Path(precguard.__file__).resolve().parent.parent
PACKAGE = "precguard"


@dataclass(frozen=True)
class Import:
    """One import statement's target as written: ``module`` and the ``name`` taken from it."""

    importer: str
    module: str
    name: str | None
    line: int


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


def _imports(name: str, path: Path) -> list[Import]:
    """The imports of one module, wherever they stand, except under ``if TYPE_CHECKING``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for stmt in node.body:
                skipped.update(id(n) for n in ast.walk(stmt))
    found: list[Import] = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [Import(name, alias.name, None, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                # "from . import x" in a package is relative to the package itself
                base = name.split(".") if is_package else name.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found += [Import(name, module, alias.name, node.lineno) for alias in node.names]
    return [i for i in found if i.module == PACKAGE or i.module.startswith(PACKAGE + ".")]


def _target_module(imp: Import, modules: dict[str, Path]) -> str | None:
    """The project module an import makes this module depend on (a submodule when one is named)."""
    if imp.name is not None and f"{imp.module}.{imp.name}" in modules:
        return f"{imp.module}.{imp.name}"
    module = imp.module
    while module and module not in modules:
        module = module.rpartition(".")[0]
    return module or None


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    """Module -> the project modules it imports (module-level and function-level)."""
    modules = _modules(src)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = {_target_module(imp, modules) for imp in _imports(name, path)}
        graph[name] = {t for t in targets if t is not None and t != name}
    return graph


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


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert len(graph) > 50, "the graph must cover the whole package"
    found = cycles(graph)
    assert not found, "import cycles:\n" + "\n".join(_describe(c, graph) for c in found)


def _unit(module: str) -> str:
    """The subpackage a module belongs to: ``precguard.compare.engine`` -> ``precguard.compare``.

    A top-level module (``precguard.runner``) is a unit of its own.
    """
    return ".".join(module.split(".")[:2])


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


def private_imports(src: Path = SRC) -> list[str]:
    """Every import of a name or module private to another subpackage, as ``where: what``."""
    modules = _modules(src)
    offences = []
    for name, path in modules.items():
        for imp in _imports(name, path):
            dotted = imp.module if imp.name is None else f"{imp.module}.{imp.name}"
            owner = _private_owner(dotted)
            if owner is not None and owner != _unit(name):
                offences.append(f"{path.relative_to(src)}:{imp.line}: {dotted}")
    return offences


def test_no_module_imports_another_subpackages_private_name() -> None:
    offences = private_imports()
    assert not offences, "private names used across subpackages:\n" + "\n".join(offences)


#: the layers above the recording: what runs a model, judges recordings or talks to the user
_UPPER = frozenset(
    {
        "precguard.cli",
        "precguard.checklist",
        "precguard.checks",
        "precguard.compare",
        "precguard.demo",
        "precguard.interop",
        "precguard.layout",
        "precguard.localize",
        "precguard.opcheck",
        "precguard.report",
        "precguard.runner",
    }
)

#: unit -> the units it must not import: the direction of dependencies (docs: DESIGN.md)
LAYERS: dict[str, frozenset[str]] = {
    "precguard.dump": _UPPER | {"precguard.capture", "precguard.devices"},
    "precguard.devices": _UPPER | {"precguard.capture"},
    "precguard.capture": _UPPER | {"precguard.devices"},
}


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    """Imports against :data:`LAYERS`, and of the CLI by anything but a ``__main__``."""
    found = []
    for module, targets in sorted(graph.items()):
        forbidden = LAYERS.get(_unit(module), frozenset())
        for target in sorted(targets):
            if _unit(target) in forbidden:
                found.append(f"{module} -> {target}")
            elif (
                _unit(target) == "precguard.cli"
                and _unit(module) != "precguard.cli"
                and not module.endswith("__main__")  # an entry point: python -m ...
            ):
                found.append(f"{module} -> {target} (nothing imports the CLI)")
    return found


def test_lower_layers_do_not_import_upper_ones() -> None:
    violations = layer_violations(import_graph())
    assert not violations, "imports against the layering:\n" + "\n".join(violations)


def test_a_recording_module_importing_compare_is_a_layer_violation() -> None:
    graph = {"precguard.dump.writer": {"precguard.compare.engine"}, "precguard.x": set()}
    assert layer_violations(graph) == ["precguard.dump.writer -> precguard.compare.engine"]


# -- the checkers themselves must be able to fail ----------------------------------------


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


def test_type_checking_imports_are_no_edge(tmp_path: Path) -> None:
    src = _write(
        tmp_path,
        {
            "__init__.py": "",
            "low.py": (
                "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import precguard.high\n"
            ),
            "high.py": "import precguard.low\n",
        },
    )
    assert cycles(import_graph(src)) == []


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
