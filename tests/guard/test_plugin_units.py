"""The plugin's small parts: golden paths per test, the summary lines, outcomes in reports."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from precguard import pytest_plugin
from precguard.guard.session import Outcome, TestContext, current, running

HERE = Path(__file__).parent


def test_each_test_gets_its_own_golden_beside_its_module(precguard_golden: Path) -> None:
    expected = (
        HERE
        / "goldens"
        / "test_plugin_units"
        / ("test_each_test_gets_its_own_golden_beside_its_module")
    )
    assert precguard_golden == expected
    assert not precguard_golden.exists()  # written only by --precguard-update-golden


@pytest.mark.parametrize("device", ["emu:bf16", "cuda:0"])
def test_a_parametrized_test_gets_one_golden_per_parameter(
    device: str, precguard_golden: Path
) -> None:
    assert precguard_golden.name == "test_a_parametrized_test_gets_one_golden_per_parameter-" + (
        device.replace(":", "_")
    )


class TestInAClass:
    def test_the_class_is_a_folder(self, precguard_golden: Path) -> None:
        assert precguard_golden.parent.name == "TestInAClass"
        assert precguard_golden.parent.parent.name == "test_plugin_units"


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("test_x", "test_x"),
        ("test_x[cpu-bf16]", "test_x-cpu-bf16"),
        ("test_x[emu:bf16]", "test_x-emu_bf16"),
        ("test_x[a/b\\c d]", "test_x-a_b_c_d"),
        ("test_x[../..]", "test_x-.._.."),
    ],
)
def test_test_names_become_safe_folder_names(name: str, folder: str) -> None:
    assert pytest_plugin._folder_name(name) == folder
    assert "/" not in folder and "\\" not in folder


def test_the_summary_line_says_verdict_margin_and_where() -> None:
    root = Path("/repo")
    line = pytest_plugin._describe(
        Outcome(
            golden="/repo/tests/goldens/m/t",
            action="compared",
            verdict="match",
            worst_margin=0.1234,
            worst_key="layers.1.0.forward.output.0",
        ),
        root,
    )
    assert line.split() == ["match", "worst", "margin", "0.123", "layers.1.0.forward.output.0"]
    diverged = Outcome(golden="g", action="compared", verdict="diverged", worst_margin=math.inf)
    assert "DIVERGED" in pytest_plugin._describe(diverged, root)
    assert "inf" in pytest_plugin._describe(diverged, root)
    wrote = Outcome(golden="/repo/tests/goldens/m/t", action="refreshed", verdict="written")
    assert pytest_plugin._describe(wrote, root) == "golden refreshed: tests/goldens/m/t"
    missing = Outcome(golden="/elsewhere/g", action="compared", verdict="no-golden")
    assert "--precguard-update-golden" in pytest_plugin._describe(missing, root)


def test_an_outcome_travels_as_a_plain_property_and_junk_is_ignored() -> None:
    outcome = Outcome(golden="g", action="compared", verdict="match", worst_margin=0.5)
    assert Outcome.from_property(outcome.as_property()) == outcome
    assert Outcome.from_property("not a dict") is None
    assert Outcome.from_property({"golden": "g", "unknown": 1}) is None


def test_the_context_is_the_running_tests_and_gone_after(tmp_path: Path) -> None:
    outer = current()  # the plugin's, for this very test
    assert outer is not None and outer.nodeid.endswith(
        "test_the_context_is_the_running_tests_and_gone_after"
    )
    context = TestContext(nodeid="x", tmp_path=lambda: tmp_path)
    with running(context):
        assert current() is context
        assert context.workdir() == tmp_path / "precguard-1"
        assert context.workdir() == tmp_path / "precguard-2"
    assert current() is outer
