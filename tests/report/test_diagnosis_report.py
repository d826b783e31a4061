"""check --html and precguard report: a diagnosis people would rather look at than read."""

from __future__ import annotations

import html
import json
from pathlib import Path

import pytest

from precguard import Diagnosis
from precguard.checks import Finding
from precguard.report.diagnosis import render_html
from tests.compare.conftest import run_cli
from tests.report.conftest import IMG_FACT, SCRIPT_NAME, fetched_resources

#: three checks whose evidence is a curve, on a device that computes in fp16
CURVES = ["rope.position_sweep", "norm.extreme_inputs", "grads.first_batch"]


@pytest.fixture(scope="module")
def fp16_diagnosis(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(check --json, check --html) of tiny-llama on emu:fp16, the curve checks only."""
    from precguard.cli import main

    root = tmp_path_factory.mktemp("diagnosis")
    saved, page = root / "diagnosis.json", root / "check.html"
    only = [a for c in CURVES for a in ("--only", c)]
    args = ["check", "-d", "emu:fp16", *only, "--json", str(saved), "--html", str(page)]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1  # fp16 RoPE angles fail: the diagnosis has a root cause
    return saved, page


def test_check_html_puts_root_causes_first_and_plots_the_curves(
    fp16_diagnosis: tuple[Path, Path],
) -> None:
    saved, page = fp16_diagnosis
    text = page.read_text(encoding="utf-8")
    diagnosis = Diagnosis.model_validate_json(saved.read_text(encoding="utf-8"))
    causes = [f for f in diagnosis.root_causes if f.status == "fail"]
    assert causes, "the fp16 device should fail a check"
    head, rest = text.split("Findings by family", 1)
    for f in causes:
        assert f"href='#{f.id}'" in head  # each root cause links to its evidence
        assert html.escape(f.remedy) in head
    # families with status colours, evidence as tables, not JSON
    for family in {c.split(".")[0] for c in CURVES}:
        assert f"<h3>{family} " in rest
    assert "<pre>" not in rest and '": {' not in rest
    # one plot per curve: RoPE error vs position, norm error per case, grad norms per layer
    assert text.count("<svg") == len(CURVES)
    assert "position (start of bin)" in text
    assert "error vs fp64 (log)" in text
    assert "norm (log)" in text
    assert fetched_resources(text) == []


def test_report_renders_a_saved_diagnosis_and_comparison(
    fp16_diagnosis: tuple[Path, Path],
    llama_runs: tuple[Path, Path],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    saved, _ = fp16_diagnosis
    again = tmp_path / "again.html"
    code, out, _ = run_cli(["report", str(saved), "--html", str(again)], capsys)
    assert code == 0, out
    assert "wrote the diagnosis as HTML" in out
    assert again.read_text(encoding="utf-8").count("<svg") == len(CURVES)

    golden, actual = llama_runs
    result = tmp_path / "comparison.json"
    code, _, _ = run_cli(["compare", str(golden), str(actual), "--json", str(result)], capsys)
    assert code == 1
    rendered, table = tmp_path / "comparison.html", tmp_path / "comparison.csv"
    code, out, _ = run_cli(
        ["report", str(result), "--html", str(rendered), "--csv", str(table), "--recordings"],
        capsys,
    )
    assert code == 0, out
    text = rendered.read_text(encoding="utf-8")
    assert "id=first-divergence" in text
    # the recordings are still where the comparison found them: statistics per layer drawn
    assert "Suspects across layers" in text
    assert len(table.read_text(encoding="utf-8").splitlines()) > 1


def test_report_without_the_recordings_still_renders_and_says_so(
    llama_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, actual = llama_runs
    result = tmp_path / "comparison.json"
    run_cli(["compare", str(golden), str(actual), "--json", str(result)], capsys)
    moved = json.loads(result.read_text(encoding="utf-8"))
    moved["golden"], moved["actual"] = str(tmp_path / "gone-g"), str(tmp_path / "gone-a")
    result.write_text(json.dumps(moved), encoding="utf-8")
    page = tmp_path / "r.html"
    code, _, _ = run_cli(["report", str(result), "--html", str(page)], capsys)
    assert code == 0
    text = page.read_text(encoding="utf-8")
    assert "id=first-divergence" in text
    assert "statistics per layer not drawn" in text


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json at all", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"hello": 1}', "neither a comparison"),
        ('{"checklist": "quick", "findings": "many"}', "not a valid diagnosis"),
    ],
)
def test_report_refuses_what_is_not_a_result(
    content: str, says: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "result.json"
    bad.write_text(content, encoding="utf-8")
    code, _, err = run_cli(["report", str(bad), "--html", str(tmp_path / "r.html")], capsys)
    assert code == 2
    assert says in err and err.count("\n") == 1
    assert not (tmp_path / "r.html").exists()


def test_report_needs_something_to_write(tmp_path: Path, capsys) -> None:
    code, _, err = run_cli(["report", str(tmp_path / "x.json")], capsys)
    assert code == 2 and "--html" in err


def test_hostile_evidence_is_escaped_everywhere() -> None:
    # a third-party check may put anything in a finding: ids, summaries, evidence keys
    finding = Finding(
        id="plugin.check" + SCRIPT_NAME,
        status="fail",
        summary=f"module {SCRIPT_NAME} failed",
        evidence={
            SCRIPT_NAME: IMG_FACT,
            "modules": {SCRIPT_NAME: {"err": 1.0, IMG_FACT: [IMG_FACT] * 3}},
            "rows": [{"a": SCRIPT_NAME}],
        },
        remedy=f"replace {IMG_FACT}",
    )
    diagnosis = Diagnosis(
        checklist=SCRIPT_NAME,
        target=IMG_FACT,
        device="cpu",
        reference="cpu",
        dtype="float32",
        verdict="fail",
        counts={"fail": 1},
        root_causes=[finding],
        findings=[finding],
        durations={finding.id: 0.1},
        duration_s=0.1,
        created="2026-01-01T00:00:00+00:00",
    )
    text = render_html(diagnosis)
    assert SCRIPT_NAME not in text and IMG_FACT not in text
    assert text.count("<script") == 1 and "<img" not in text
    assert html.escape(SCRIPT_NAME) in text


def test_an_inconclusive_check_says_so_at_the_top(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    page = tmp_path / "check.html"
    code, _, _ = run_cli(["check", "-c", "quick", "--skip", "*", "--html", str(page)], capsys)
    assert code == 3
    head = page.read_text(encoding="utf-8").split("Findings by family", 1)[0]
    assert "INCONCLUSIVE" in head and "nothing was shown to pass" in head
    assert "root-causes" not in head


def test_a_diagnosis_has_no_csv(
    fp16_diagnosis: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    saved, _ = fp16_diagnosis
    code, _, err = run_cli(
        ["report", str(saved), "--html", str(tmp_path / "r.html"), "--csv", str(tmp_path / "c")],
        capsys,
    )
    assert code == 2 and "apply to a comparison" in err
