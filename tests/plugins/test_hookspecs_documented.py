"""Every hook spec is typed, documented in its docstring and in docs/plugins.md, and tested."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest

from precguard import hookspecs

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "plugins.md").read_text()
TEST_SOURCES = {
    p.name: p.read_text()
    for p in (ROOT / "tests").rglob("test_*.py")
    if p.name != Path(__file__).name
}
SPECS = sorted(n for n, f in vars(hookspecs).items() if n.startswith("precguard_") and callable(f))


def test_there_are_hooks() -> None:
    assert {"precguard_backend", "precguard_register_checks", "precguard_vendor_dump"} <= set(SPECS)


@pytest.mark.parametrize("name", SPECS)
def test_hook_is_typed_documented_and_tested(name: str) -> None:
    func = getattr(hookspecs, name)
    doc = inspect.getdoc(func) or ""
    signature = inspect.signature(func)
    assert signature.return_annotation is not inspect.Signature.empty, name
    for param in signature.parameters.values():
        assert param.annotation is not inspect.Parameter.empty, f"{name}({param.name})"
        assert f":param {param.name}:" in doc, f"{name}: document parameter {param.name}"
    first_line = doc.splitlines()[0]
    assert first_line.startswith(("Return", "Register", "Record")), first_line
    assert ":return:" in doc or "Return " in first_line, f"{name}: say what it returns"
    firstresult = func.precguard_spec["firstresult"]
    assert ("Stops at the first non-None result." in doc) == firstresult, name
    assert f"### `{name}(" in GUIDE, f"docs/plugins.md has no section for {name}"
    assert any(name in src for src in TEST_SOURCES.values()), f"no test mentions {name}"
