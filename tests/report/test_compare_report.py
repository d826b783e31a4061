"""compare --html / --csv: the report a precision investigation is shared as."""

from __future__ import annotations

import csv
import html
from pathlib import Path

import pytest

import precguard
from tests.compare.conftest import record, run_cli
from tests.report.conftest import (
    FAULT,
    FORMULA_NAME,
    IMG_FACT,
    SCRIPT_NAME,
    fetched_resources,
)


def test_fetch_detector_sees_what_a_page_could_fetch() -> None:
    # the self-containment assertions below are only as good as this detector
    for fetch in (
        '<img src="https://cdn.example/x.png">',
        "<script src=//cdn.example/plot.js></script>",
        "<link rel=stylesheet href='http://example/a.css'>",
        "<style>body { background: url( 'https://e/x.png') }</style>",
        '<style>@import "https://e/a.css";</style>',
        '<use xlink:href="http://e/s.svg#a"/>',
    ):
        assert fetched_resources(fetch), fetch
    for inert in (
        '<svg xmlns="http://www.w3.org/2000/svg" xmlns:xlink="http://www.w3.org/1999/xlink">',
        '<use xlink:href="#m1a2b3c"/>',
        "<p>see https://example.org in the text</p>",
        "<image xlink:href='data:image/png;base64,AAAA'/>",
    ):
        assert not fetched_resources(inert), inert


def test_compare_html_names_the_planted_fault_with_plots_and_every_record(
    llama_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, actual = llama_runs
    page, saved = tmp_path / "report.html", tmp_path / "result.json"
    code, out, _ = run_cli(
        ["compare", str(golden), str(actual), "--html", str(page), "--json", str(saved)], capsys
    )
    assert code == 1, out
    text = page.read_text(encoding="utf-8")
    result = precguard.Comparison.model_validate_json(saved.read_text(encoding="utf-8"))
    assert result.first_divergence is not None
    assert result.first_divergence.module == FAULT.module

    top = text.split('id="records"', 1)[0] if 'id="records"' in text else text
    assert "DIVERGED" in top
    box = text.split("id=first-divergence", 1)[1].split("</div>", 1)[0]
    assert FAULT.module in box
    assert "expected error" in box and "measured error" in box
    assert "precguard replay" in box  # the next command, ready to paste
    # the error plot, and the suspects' statistics across layers from the recordings
    assert text.count("<svg") >= 2
    assert "model.layers.*.input_layernorm" in text
    assert "first divergence: " + FAULT.module in text  # marked on the error plot
    # one table row per record, each with its status for the filter
    assert text.count("<tr data-status=") == len(result.records)
    assert fetched_resources(text) == []


def test_csv_opens_with_one_row_per_record_in_execution_order(
    llama_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, actual = llama_runs
    table = tmp_path / "records.csv"
    code, _, _ = run_cli(["compare", str(golden), str(actual), "--csv", str(table)], capsys)
    assert code == 1
    result = precguard.compare_runs(golden, actual)
    with table.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(result.records)
    assert [r["key"] for r in rows] == [r.key for r in result.records]
    assert [int(r["index"]) for r in rows] == list(range(len(rows)))
    fd = result.first_divergence
    assert fd is not None
    named = next(r for r in rows if r["key"] == fd.key and int(r["step"]) == fd.step)
    assert (named["status"], named["local"], named["module"]) == ("fail", "true", FAULT.module)
    assert float(named["error"]) > float(named["expected_error"]) > 0
    for column in ("module", "rank", "phase", "golden_dtype", "actual_dtype", "cosine", "status"):
        assert column in rows[0]


def test_hostile_names_are_shown_as_text_not_run(
    hostile_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, actual = hostile_runs
    page, table = tmp_path / "r.html", tmp_path / "r.csv"
    code, _, _ = run_cli(
        ["compare", str(golden), str(actual), "--html", str(page), "--csv", str(table)], capsys
    )
    assert code == 1
    text = page.read_text(encoding="utf-8")
    assert SCRIPT_NAME not in text and IMG_FACT not in text
    assert html.escape(SCRIPT_NAME) in text  # named, as text, as the first divergence
    assert html.escape(IMG_FACT) in text  # the fingerprint difference
    assert text.count("<script") == 1  # the page's own sorting script, nothing else
    with table.open(newline="", encoding="utf-8") as fh:
        modules = {r["module"] for r in csv.DictReader(fh)}
    # a spreadsheet would evaluate '=1+2': the cell is quoted as text
    assert "'" + FORMULA_NAME in modules and FORMULA_NAME not in modules
    assert SCRIPT_NAME in modules  # CSV is not HTML: the name is kept as it is


def test_partial_match_says_what_was_not_compared(
    llama_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = record(tmp_path / "golden", steps=2)
    actual = llama_runs[0]  # the same model, one step
    page = tmp_path / "r.html"
    code, _, _ = run_cli(["compare", str(golden), str(actual), "--html", str(page)], capsys)
    assert code == 3
    text = page.read_text(encoding="utf-8")
    assert "PARTIAL MATCH" in text
    assert "not compared: " in text and "steps" in text


def test_an_output_that_cannot_be_written_is_refused_first(
    llama_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, actual = llama_runs
    missing = tmp_path / "no" / "such" / "dir" / "r.html"
    code, _, err = run_cli(["compare", str(golden), str(actual), "--html", str(missing)], capsys)
    assert code == 2  # refused before comparing: a long compare is not wasted
    assert err.startswith("precguard: error: --html") and err.count("\n") == 1
    assert "does not exist" in err
