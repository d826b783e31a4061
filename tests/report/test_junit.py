"""``compare --junit-xml`` and ``check --junit-xml``: CI shows each failing record or check.

Every file is validated against ``junit.xsd`` beside this test, the JUnit schema
shape CI systems read (Jenkins' junit-10, the Ant/Surefire format); pytest's own
``--junitxml`` output validates against it too, so the schema is the common one
and not one fitted to precguard's writer.
"""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import xmlschema

from precguard import plugins
from precguard.checks import Check, finding
from precguard.cli import main
from precguard.testing import record_model
from tests.guard.models import batch, build

SCHEMA = xmlschema.XMLSchema(Path(__file__).with_name("junit.xsd"))


def _run(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def _cases(path: Path) -> dict[str, ET.Element]:
    SCHEMA.validate(str(path))
    return {c.get("name", ""): c for c in ET.parse(path).getroot().iter("testcase")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A golden, a clean run, a run with layer 1 off by 0.1 %, and a golden with backward."""
    base = tmp_path_factory.mktemp("junit")
    faulty = build()
    faulty.layers[1].gain = 1.001
    return {
        "golden": record_model(build(), batch(), base / "golden"),
        "clean": record_model(build(), batch(), base / "clean"),
        "faulty": record_model(faulty, batch(), base / "faulty"),
        "trained": record_model(build(), batch(), base / "trained", train=True),
    }


def test_a_diverged_comparison_is_one_failing_case_per_failing_record(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "compare.xml"
    code = _run(["compare", str(runs["golden"]), str(runs["faulty"]), "--junit-xml", str(out)])
    assert code == 1
    cases = _cases(out)
    failing = {name: c for name, c in cases.items() if c.find("failure") is not None}
    assert failing and all(not name.startswith("layers.0.") for name in failing)
    first = [c for c in failing.values() if c.find("failure").get("type") == "first-divergence"]
    assert len(first) == 1 and first[0].get("classname") == "layers.1"
    assert "first divergence" in first[0].find("failure").get("message")
    root = ET.parse(out).getroot()
    assert int(root.get("failures")) == len(failing) and int(root.get("tests")) == len(cases)


def test_a_match_validates_with_no_failure(runs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "compare.xml"
    assert _run(["compare", str(runs["golden"]), str(runs["clean"]), "--junit-xml", str(out)]) == 0
    cases = _cases(out)
    assert cases and not any(c.find("failure") is not None for c in cases.values())
    assert out.read_bytes() == _rerun(runs, tmp_path, "golden", "clean")  # no timestamps


def _rerun(runs: dict[str, Path], tmp_path: Path, golden: str, actual: str) -> bytes:
    again = tmp_path / "again.xml"
    _run(["compare", str(runs[golden]), str(runs[actual]), "--junit-xml", str(again)])
    return again.read_bytes()


def test_a_partial_match_is_an_error_case_unless_allowed(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    out = tmp_path / "partial.xml"
    args = ["compare", str(runs["trained"]), str(runs["clean"]), "--junit-xml", str(out)]
    assert _run(args) == 3
    coverage = _cases(out)["coverage"]
    assert coverage.find("error") is not None
    assert "partial match" in coverage.find("error").get("message")
    assert _run([*args, "--allow-partial"]) == 0
    assert _cases(out)["coverage"].find("skipped") is not None


def test_an_unwritable_junit_path_is_refused_before_comparing(
    runs: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "no" / "such" / "dir.xml"
    assert _run(["compare", str(runs["golden"]), str(runs["clean"]), "--junit-xml", str(out)]) == 2
    assert "--junit-xml" in capsys.readouterr().err


class _Checks:
    """Checks with every status CI must show: fail, error, warn, skip."""

    @plugins.hookimpl
    def precguard_register_checks(self, register):
        def bad(ctx):
            return [finding("ops.junit_bad", "fail", "softmax runs in fp16", {"max_err": 0.2})]

        def warn(ctx):
            return [finding("ops.junit_warn", "warn", "close to the limit")]

        def boom(ctx):
            raise RuntimeError("kaboom <&>")

        def skip(ctx):
            return [finding("ops.junit_skip", "skip", "not applicable here")]

        for name, func in [("bad", bad), ("warn", warn), ("boom", boom), ("skip", skip)]:
            register(Check(f"ops.junit_{name}", f"{name} on purpose", func, needs_target=False))


def test_check_writes_one_case_per_finding_with_its_status(tmp_path: Path) -> None:
    plugin = _Checks()
    plugins.load_plugins().register(plugin, name="test-junit-checks")
    try:
        spec = tmp_path / "list.yaml"
        spec.write_text(
            "name: ci\ndescription: test\nchecks: [ops.junit_bad, ops.junit_warn, "
            "ops.junit_boom, ops.junit_skip, env.fingerprint]\n"
        )
        out = tmp_path / "check.xml"
        assert _run(["check", "--checklist", str(spec), "--junit-xml", str(out)]) == 1
    finally:
        plugins.pm.unregister(plugin)
    cases = _cases(out)
    assert cases["ops.junit_bad"].find("failure").get("message") == "softmax runs in fp16"
    assert "kaboom <&>" in cases["ops.junit_boom"].find("error").get("message")
    assert cases["ops.junit_skip"].find("skipped") is not None
    assert "close to the limit" in cases["ops.junit_warn"].find("system-out").text
    assert len(cases["env.fingerprint"]) == 0  # a pass has no child
    assert cases["ops.junit_bad"].get("classname") == "precguard.check.ops"


def test_a_check_run_with_nothing_to_show_is_an_error_case(tmp_path: Path) -> None:
    out = tmp_path / "check.xml"
    assert _run(["check", "--checklist", "quick", "--skip", "*", "--junit-xml", str(out)]) == 3
    assert _cases(out)["verdict"].find("error").get("type") == "inconclusive"


@pytest.mark.slow
def test_the_schema_is_the_one_pytest_writes_too(tmp_path: Path) -> None:
    (tmp_path / "test_x.py").write_text(
        "import pytest\n\ndef test_ok():\n    pass\n\ndef test_bad():\n    assert 0\n\n"
        "@pytest.mark.skip('no')\ndef test_skip():\n    pass\n"
    )
    out = tmp_path / "pytest.xml"
    subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:precguard", f"--junitxml={out}"],
        cwd=tmp_path,
        capture_output=True,
        timeout=120,
    )
    SCHEMA.validate(str(out))
    assert len(_cases(out)) == 3


def test_a_match_with_nothing_compared_is_an_error_case(
    runs: dict[str, Path], tmp_path: Path
) -> None:
    from precguard.compare import Counts
    from precguard.compare import compare_recordings as compare_runs
    from precguard.report.junit import comparison_junit, write_junit

    result = compare_runs(runs["golden"], runs["clean"])
    assert result.verdict == "match"
    empty = result.model_copy(update={"records": [], "counts": Counts()})
    out = write_junit(tmp_path / "empty.xml", comparison_junit(empty, allow_partial=True))
    case = _cases(out)["compared"]
    assert case.find("error") is not None
    assert "nothing was compared" in case.find("error").get("message")
