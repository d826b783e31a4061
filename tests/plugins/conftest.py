"""Fixtures for the plugin manager's tests (each vendor plugin's tests live in its distribution)."""

from __future__ import annotations

from collections.abc import Iterator

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
