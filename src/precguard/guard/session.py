"""What a precision test knows about the pytest session it runs in.

The pytest plugin (:mod:`precguard.pytest_plugin`) opens a :class:`TestContext`
around each test; :func:`precguard.testing.assert_matches_golden` reads it to
learn whether goldens are being refreshed, where the test's temporary files go
and where to leave its outcome for the session summary. Outside pytest (or with
``-p no:precguard``) there is no context and the function works on its own.

Stdlib only: the plugin imports this module in every pytest run where
precguard is installed.
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

#: the name under which an outcome travels in a test report's ``user_properties``
#: (so pytest-xdist carries it from the workers, and pytest's own JUnit XML shows it)
PROPERTY = "precguard"


@dataclass(frozen=True)
class Outcome:
    """What one ``assert_matches_golden`` call did, for the session summary."""

    golden: str
    action: str  # compared, new, refreshed, unchanged
    verdict: str  # match, diverged, partial, no-golden, unusable, written
    worst_margin: float | None = None
    worst_key: str | None = None
    worst_module: str | None = None
    report: str | None = None

    def as_property(self) -> dict[str, Any]:
        """A plain dict for ``user_properties``."""
        return asdict(self)

    @classmethod
    def from_property(cls, value: Any) -> Outcome | None:
        """Read an outcome back from ``user_properties`` (None if it is not one)."""
        if not isinstance(value, dict):
            return None
        try:
            return cls(**value)
        except TypeError:
            return None


@dataclass
class TestContext:
    """The test now running, as the plugin describes it to precision assertions."""

    __test__ = False  # not a test class, whatever pytest thinks of the name

    nodeid: str
    update: bool = False
    device: str | None = None
    properties: list[tuple[str, object]] = field(default_factory=list)
    tmp_path: Callable[[], Path | None] = lambda: None
    calls: int = 0

    def workdir(self) -> Path:
        """A fresh folder for this call's recording and report, beside the test's tmp files."""
        self.calls += 1
        base = self.tmp_path()
        if base is None:
            return Path(tempfile.mkdtemp(prefix="precguard-"))
        path = base / f"precguard-{self.calls}"
        path.mkdir(parents=True, exist_ok=True)
        return path

    def add(self, outcome: Outcome) -> None:
        """Leave ``outcome`` in the test's report (read back by the session summary)."""
        self.properties.append((PROPERTY, outcome.as_property()))


_CURRENT: ContextVar[TestContext | None] = ContextVar("precguard_test", default=None)


def current() -> TestContext | None:
    """The running test's context, or None outside a pytest run with the plugin."""
    return _CURRENT.get()


@contextlib.contextmanager
def running(context: TestContext) -> Iterator[TestContext]:
    """Make ``context`` the current test's while the block runs."""
    token = _CURRENT.set(context)
    try:
        yield context
    finally:
        _CURRENT.reset(token)
