"""Every command has a documented function in the public API, named for what it does."""

from __future__ import annotations

import inspect

import pytest

import precguard

#: command -> the public function that does its work
COMMANDS = {
    "record": "record_target",
    "compare": "compare_runs",
    "bitwise": "compare_bitwise",
    "replay": "replay_module",
    "bisect": "bisect",
    "op-check": "op_check",
    "check": "check",
    "ranks": "check_replicas",
    "import-msprobe": "import_msprobe",
}


@pytest.mark.parametrize(("command", "name"), sorted(COMMANDS.items()))
def test_each_command_is_a_documented_api_function(command: str, name: str) -> None:
    func = getattr(precguard, name)
    assert callable(func) and name in precguard.__all__
    assert inspect.getdoc(func), f"precguard.{name} ({command}) has no docstring"


def test_the_context_manager_has_a_name_of_its_own_and_its_old_one_is_deprecated(
    tmp_path,
) -> None:
    assert precguard.recording is not precguard.record_target
    with pytest.warns(DeprecationWarning, match="use precguard.recording"):
        handle = precguard.record(tmp_path / "run")
    with handle:  # still opens the same recording
        handle.step()
    assert isinstance(handle, precguard.Handle)
    assert precguard.load_run(tmp_path / "run").manifest.complete


def test_dir_lists_the_lazy_public_api_before_anything_is_loaded() -> None:
    import subprocess
    import sys

    # a fresh interpreter: nothing exported has been touched, so only __dir__ can list it
    code = "import precguard, sys; print(sorted(set(precguard.__all__) - set(dir(precguard))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_one_side_of_a_comparison_is_one_public_class() -> None:
    # what runs where is said one way: precguard.Side, set up as the TargetRun every
    # command shares; the other classes that had the name now say what they are
    from precguard import TargetRun

    assert "Side" in precguard.__all__ and "Side" in dir(precguard)
    side = precguard.Side("handwritten-llama", "cpu")
    run = side.open()
    assert isinstance(run, TargetRun)
    assert (run.device, run.name) == ("cpu", "handwritten-llama")
    import precguard.compare.runs as runs
    import precguard.generation.report as report

    assert not hasattr(runs, "Side") and not hasattr(report, "Side")


#: what a caller catches, annotates or reads back, each reachable as precguard.<name>
CALLER_NAMES = {
    # errors, each with its own exit code
    "UsageError": 2,
    "TargetError": 2,
    "DeviceUnavailableError": 2,
    "DumpFormatError": 2,
    "OutputExistsError": 2,
}


@pytest.mark.parametrize(("name", "code"), sorted(CALLER_NAMES.items()))
def test_the_errors_a_caller_catches_are_public_with_their_exit_code(name: str, code: int) -> None:
    error = getattr(precguard, name)
    assert name in precguard.__all__ and name in dir(precguard)
    assert issubclass(error, precguard.PrecguardError) and error.exit_code == code


@pytest.mark.parametrize(
    "name",
    [
        "BisectResult",  # precguard.bisect's result
        "BitwiseComparison",  # precguard.compare_bitwise's result
        "BitwiseDifference",
        "TargetRun",  # Side.open()
        "Stats",  # a Record's fields (docs/recording.md)
        "TensorRef",
        "Sample",
        "PositionNorms",
        "replay_suspects",
        "resolve_backend",
        "seed_everything",
        "load_watch",  # a watch directory read back
        "WatchRun",
    ],
)
def test_what_a_caller_annotates_or_calls_is_public(name: str) -> None:
    assert name in precguard.__all__ and name in dir(precguard)
    value = getattr(precguard, name)
    assert callable(value) and inspect.getdoc(value), f"precguard.{name} has no docstring"


def test_the_result_models_of_a_comparison_are_in_the_compare_subpackage() -> None:
    import precguard.checks

    result_models = ("Counts", "Suspect", "RecordIdentity", "SameRecordingError")
    for name in result_models:
        assert name in precguard.compare.__all__ and getattr(precguard.compare, name)
    assert issubclass(precguard.compare.SameRecordingError, precguard.PrecguardError)
    assert "finding" in precguard.checks.__all__
