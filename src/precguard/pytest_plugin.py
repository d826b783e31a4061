"""The pytest plugin: golden paths per test, ``--precguard-update-golden``, a margin summary.

Registered through the ``pytest11`` entry point, so it is active wherever
precguard is installed; ``-p no:precguard`` turns it off. Loading it costs
next to nothing: torch and the rest of precguard are imported only when a test
calls :func:`precguard.testing.assert_matches_golden`.

- ``--precguard-update-golden``: precision assertions write (or refresh) their
  goldens instead of comparing; the summary lists each one written.
- ``--precguard-device DEVICE``: the device of precision assertions that name
  none, so one test writes its golden on the reference device and checks the
  port's device against it (``--precguard-device npu`` in the port's CI).
- ``precguard_golden``: a fixture giving the test's own golden folder,
  ``<test folder>/goldens/<test module>/<test name>`` (the ini option
  ``precguard_golden_dir`` moves the root, relative to the rootdir).
- the terminal summary lists every precision test with its worst margin
  (measured ÷ allowed error, 1 = at the limit), so drift shows before it fails.
"""

from __future__ import annotations

import math
import re
from collections.abc import Generator
from pathlib import Path

import pytest

from precguard.guard.session import PROPERTY, Outcome, TestContext, running

UPDATE_OPTION = "--precguard-update-golden"
DEVICE_OPTION = "--precguard-device"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add ``--precguard-update-golden`` and the ``precguard_golden_dir`` ini option."""
    group = parser.getgroup("precguard", "precision regression tests (precguard)")
    group.addoption(
        UPDATE_OPTION,
        action="store_true",
        default=False,
        help="write or refresh the golden recordings of precision tests instead of "
        "comparing with them (review the diff, then commit them)",
    )
    group.addoption(
        DEVICE_OPTION,
        default=None,
        metavar="DEVICE",
        help="device for precision assertions that name none (cpu, cuda, npu:0, emu:bf16): "
        "write the goldens on the reference device, check them on the port's",
    )
    parser.addini(
        "precguard_golden_dir",
        "folder holding the goldens of precguard_golden, relative to the rootdir "
        "(default: goldens/ beside each test module)",
        default="",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the summary of the session's precision tests."""
    config.pluginmanager.register(PrecisionSummary(config.rootpath), "precguard-summary")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, None, None]:
    """Tell precision assertions which test runs, whether to update, where tmp files go."""
    funcargs = getattr(item, "funcargs", {})
    context = TestContext(
        nodeid=item.nodeid,
        update=bool(item.config.getoption(UPDATE_OPTION)),
        device=item.config.getoption(DEVICE_OPTION),
        properties=item.user_properties,
        tmp_path=lambda: funcargs.get("tmp_path"),
    )
    with running(context):
        return (yield)


@pytest.fixture
def precguard_golden(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """The golden folder of the requesting test.

    ``<folder of the test module>/goldens/<module name>/<test name>``, or under
    the ini option ``precguard_golden_dir`` (relative to the rootdir). A
    parametrized test gets one folder per parameter set (``test_x-cpu``).
    The folder is not created: ``--precguard-update-golden`` writes it.
    """
    node = request.node
    module = Path(str(node.path))
    root = request.config.getini("precguard_golden_dir")
    base = Path(request.config.rootpath, root) if root else module.parent / "goldens"
    parts = [module.stem]
    if request.cls is not None:
        parts.append(request.cls.__name__)
    parts.append(_folder_name(node.name))
    return base.joinpath(*parts)


class PrecisionSummary:
    """Collects what precision tests left in their reports and lists it at the end."""

    def __init__(self, rootpath: Path) -> None:
        self.rootpath = rootpath
        self.seen: list[tuple[str, Outcome]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Keep the outcomes a test's call left (reports from xdist workers too)."""
        if report.when != "call":
            return
        for name, value in report.user_properties:
            if name == PROPERTY and (outcome := Outcome.from_property(value)) is not None:
                self.seen.append((report.nodeid, outcome))

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """List each precision test with its worst margin, and the goldens written."""
        if not self.seen:
            return
        tr = terminalreporter
        tr.write_sep("=", "precguard precision tests")
        width = min(max(len(nodeid) for nodeid, _ in self.seen), 70)
        for nodeid, outcome in self.seen:
            tr.write_line(f"{nodeid:<{width}}  {_describe(outcome, self.rootpath)}")
        if any(o.action == "compared" for _, o in self.seen):
            tr.write_line("margin: measured error / allowed error of the worst record (1: limit)")


def _describe(outcome: Outcome, rootpath: Path) -> str:
    golden = _relative(outcome.golden, rootpath)
    if outcome.action != "compared":
        return f"golden {outcome.action}: {golden}"
    if outcome.verdict == "no-golden":
        return f"NO GOLDEN (run pytest {UPDATE_OPTION}): {golden}"
    if outcome.verdict == "unusable":
        return f"UNUSABLE: cannot compare with {golden}"
    word = {"match": "match", "diverged": "DIVERGED", "partial": "PARTIAL"}.get(
        outcome.verdict, outcome.verdict
    )
    margin = outcome.worst_margin
    if margin is None:
        return f"{word:<9} nothing compared"
    shown = "inf" if math.isinf(margin) else f"{margin:.3g}"
    where = f"  {outcome.worst_key}" if margin > 0 and outcome.worst_key else ""
    return f"{word:<9} worst margin {shown:>7}{where}"


def _relative(path: str, rootpath: Path) -> str:
    """``path`` relative to the rootdir when it lies below it (shorter, same on every machine)."""
    try:
        return Path(path).resolve().relative_to(rootpath.resolve()).as_posix()
    except ValueError:
        return path


def _folder_name(test_name: str) -> str:
    """A test name as a folder name: ``test_x[cpu-bf16]`` -> ``test_x-cpu-bf16``."""
    name, _, params = test_name.partition("[")
    if params:
        name = f"{name}-{params.rstrip(']')}"
    return _UNSAFE.sub("_", name).strip("_") or "test"
