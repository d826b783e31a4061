"""Fixtures for the plugin manager's tests (each vendor plugin's tests live in its distribution)."""

from __future__ import annotations

import importlib
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from precguard import plugins


@pytest.fixture
def fresh_plugins() -> Iterator[None]:
    """Reload every plugin before the test and again after it (env vars may have changed)."""
    plugins.reset()
    try:
        yield
    finally:
        plugins.reset()
        plugins.load_plugins()


@pytest.fixture
def install_plugin(
    fresh_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Callable[[str, str], None]:
    """Install a third-party plugin distribution ``name`` (one module of ``source``) the way
    pip would leave it: a module and a ``.dist-info`` with a ``precguard`` entry point."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def install(name: str, source: str) -> None:
        module = f"{name}_plugin"
        (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
        info = tmp_path / f"{name}-0.3.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.3\n")
        (info / "entry_points.txt").write_text(f"[precguard]\n{name} = {module}\n")
        importlib.invalidate_caches()
        plugins.reset()

    return install
