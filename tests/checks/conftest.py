"""Run ``precguard check`` in-process and read its JSON diagnosis."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from precguard.checks import Finding

PLANTED = str(Path(__file__).with_name("planted.py"))


class CheckRun:
    """Exit code, stdout, stderr and the parsed diagnosis of one ``precguard check``."""

    def __init__(self, code: int, out: str, err: str, diagnosis: dict[str, Any] | None) -> None:
        self.code = code
        self.out = out
        self.err = err
        self.diagnosis = diagnosis or {}

    def finding(self, check_id: str) -> dict[str, Any]:
        """The finding of ``check_id`` (the first one)."""
        for f in self.diagnosis["findings"]:
            if f["id"] == check_id:
                return f
        raise AssertionError(
            f"no finding {check_id} in {[f['id'] for f in self.diagnosis['findings']]}"
        )

    def statuses(self, status: str) -> list[str]:
        """Ids of the findings with ``status``."""
        return [f["id"] for f in self.diagnosis["findings"] if f["status"] == status]

    @property
    def root_cause(self) -> str | None:
        causes = self.diagnosis["root_causes"]
        return causes[0]["id"] if causes else None


@pytest.fixture
def run_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Callable[..., CheckRun]:
    """``run_check("--target", T, "--device", D, ...)`` -> :class:`CheckRun`."""
    from precguard.cli import main

    counter = iter(range(1000))

    def run(*args: str) -> CheckRun:
        json_path = tmp_path / f"diagnosis{next(counter)}.json"
        argv = ["check", *args, "--json", str(json_path)]
        with pytest.raises(SystemExit) as exc:
            main(argv)
        captured = capsys.readouterr()
        diagnosis = json.loads(json_path.read_text()) if json_path.exists() else None
        return CheckRun(int(exc.value.code or 0), captured.out, captured.err, diagnosis)

    return run


def planted(name: str) -> str:
    """Target spec of a planted-fault target."""
    return f"{PLANTED}:{name}"


@pytest.fixture
def plugin_checklist(tmp_path: Path) -> Iterator[Callable[[Finding], Path]]:
    """``plugin_checklist(finding)`` -> a checklist whose one check, a plugin's, returns it.

    The plugin is registered for the test and unregistered after it (the llm way).
    """
    from precguard import hookimpl, plugins
    from precguard.checks import Check

    registered: list[str] = []

    def make(found: Finding) -> Path:
        class OneCheckPlugin:
            @hookimpl
            def precguard_register_checks(self, register) -> None:
                register(Check(found.id, "a plugin's check", lambda ctx: found, False))

        name = f"one-check-{len(registered)}"
        plugins.load_plugins().register(OneCheckPlugin(), name=name)
        registered.append(name)
        path = tmp_path / f"{name}.yaml"
        path.write_text(f"name: {name}\ndescription: d\nchecks: [{found.id}]\n")
        return path

    yield make
    for name in registered:
        plugins.load_plugins().unregister(name=name)


@pytest.fixture
def forward_passes() -> Iterator[Callable[[str], int]]:
    """``forward_passes("ClassName")``: calls of modules of that class since the test began.

    Counted with a global forward pre-hook (removed afterwards): fixed work, the same
    on any machine, so a test of what checks share never depends on speed.
    """
    from collections import Counter

    from torch.nn.modules.module import register_module_forward_pre_hook

    calls: Counter[str] = Counter()
    handle = register_module_forward_pre_hook(lambda m, _a: calls.update([type(m).__name__]))
    try:
        yield lambda name: calls[name]
    finally:
        handle.remove()
