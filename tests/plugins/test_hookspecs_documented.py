"""Every hook spec is typed, documented in its docstring and in docs/plugins.md, and called.

"Called" means: the public function that depends on the hook makes precguard
call it through pluggy, asking every plugin that implements it. A new hook
without an entry in :data:`CALLED_BY` fails here until a public call uses it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from precguard import hookspecs, plugins

ROOT = Path(__file__).resolve().parents[2]
GUIDE = (ROOT / "docs" / "plugins.md").read_text()
SPECS = sorted(n for n, f in vars(hookspecs).items() if n.startswith("precguard_") and callable(f))

#: hook -> a public call that needs it
CALLED_BY: dict[str, Callable[[], Any]] = {
    "precguard_register_backends": lambda: plugins.get_backend("emu:fp16"),
    "precguard_register_checks": plugins.collect_checks,
    "precguard_register_switches": plugins.collect_switches,
}


def test_there_are_hooks() -> None:
    assert set(SPECS) == {
        "precguard_register_backends",
        "precguard_register_checks",
        "precguard_register_switches",
    }
    # each says what its register takes and files it under (the registry refuses the rest)
    assert set(hookspecs.REGISTERS) == set(SPECS)


@pytest.mark.parametrize("name", SPECS)
def test_hook_is_typed_and_documented(name: str) -> None:
    func = getattr(hookspecs, name)
    doc = inspect.getdoc(func) or ""
    signature = inspect.signature(func)
    assert signature.return_annotation is not inspect.Signature.empty, name
    for param in signature.parameters.values():
        assert param.annotation is not inspect.Parameter.empty, f"{name}({param.name})"
        assert f":param {param.name}:" in doc, f"{name}: document parameter {param.name}"
    first_line = doc.splitlines()[0]
    assert first_line.startswith("Register"), first_line
    assert ":return:" in doc, f"{name}: say what it returns"
    firstresult = func.precguard_spec["firstresult"]
    assert ("Stops at the first non-None result." in doc) == firstresult, name
    assert f"### `{name}(" in GUIDE, f"docs/plugins.md has no section for {name}"


@pytest.mark.parametrize("name", SPECS)
def test_hook_is_called_through_pluggy_asking_every_plugin(name: str, fresh_plugins: None) -> None:
    assert name in CALLED_BY, f"no public call exercises {name}: add one to CALLED_BY"
    pm = plugins.pm  # not loaded yet: the load's own calls are watched too
    asked: list[set[str]] = []

    def before(hook_name: str, hook_impls: list[Any], kwargs: dict[str, Any]) -> None:
        if hook_name == name:
            asked.append({impl.plugin_name for impl in hook_impls})

    undo = pm.add_hookcall_monitoring(before, lambda *args: None)
    try:
        CALLED_BY[name]()
    finally:
        undo()
    implementers = {impl.plugin_name for impl in getattr(pm.hook, name).get_hookimpls()}
    assert implementers, f"no plugin implements {name}"
    # each plugin is asked on its own (its own ``register``), every implementer once
    last_build = asked[-len(implementers) :]
    assert all(len(one) == 1 for one in last_build), asked
    assert set().union(*last_build) == implementers, (name, asked, implementers)
