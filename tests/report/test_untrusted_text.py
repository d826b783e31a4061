"""Text from recordings is never interpreted: not by matplotlib, not by a spreadsheet.

A module name is anyone's text. ``$\\frac$`` must not reach matplotlib's
mathtext (the report would fail and ``--json`` go unwritten), and a name with
a bare CR or a ``;``-separated formula must not become a row or a formula in
a spreadsheet.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from precguard.report.plots import figure, to_svg
from tests.compare.conftest import run_cli

MATH = r"$\frac$"
CR_FORMULA = "a\r=1+41"
SEMICOLON_FORMULA = "x;=1+41;y"
NAMES = (MATH, CR_FORMULA, SEMICOLON_FORMULA)


class Named(nn.Module):
    """Three layers named with hostile text, in that order."""

    def __init__(self) -> None:
        super().__init__()
        for name in NAMES:
            self.add_module(name, nn.Linear(8, 8))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for name in NAMES:
            x = torch.tanh(getattr(self, name)(x))
        return x


@pytest.fixture(scope="module")
def named_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(golden, actual): the second with the ``$\\frac$`` layer's output off by 1 %."""
    root = tmp_path_factory.mktemp("untrusted-text")
    out = []
    for side, fault in (("golden", False), ("actual", True)):
        torch.manual_seed(0)
        model = Named()
        if fault:
            getattr(model, MATH).register_forward_hook(lambda _m, _a, y: y * 1.01)
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
        with torch.no_grad(), precguard.monitor(model, out=root / side, tensors=True):
            model(x)
        out.append(root / side)
    return out[0], out[1]


def test_compare_html_names_a_math_module_and_writes_the_verdict(
    named_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, actual = named_runs
    page, result = tmp_path / "r.html", tmp_path / "r.json"
    code, _, err = run_cli(
        ["compare", str(golden), str(actual), "--html", str(page), "--json", str(result)], capsys
    )
    assert code == 1, err  # the verdict, not "internal error"
    assert json.loads(result.read_text())["first_divergence"]["module"] == MATH
    assert MATH in page.read_text(encoding="utf-8")  # shown as written


def test_every_label_of_a_plot_stays_plain_text() -> None:
    fig = figure()
    ax = fig.add_subplot()
    ax.plot([1, 2, 3], [1e-3, 1e-2, 1e-1], label=MATH)
    ax.set_yscale("log")
    ax.set_xticks([1, 2, 3], [MATH, "b$x$", "c"])
    ax.annotate(MATH, (2, 1e-2))
    ax.set_title(MATH)
    fig.legend()
    bars = fig.add_subplot(2, 1, 2)
    bars.bar([MATH, r"$\sqrt$"], [1, 2])  # categorical ticks, made at draw time
    svg = to_svg(fig)
    assert svg.count(MATH) >= 4  # legend, tick, annotation, title, category
    # the log axis' own tick labels are still math (the SVG keeps math's source in a comment)
    assert "<!-- $\\mathdefault{10^{-3}}$ -->" in svg
    assert f"<!-- {MATH} -->" not in svg


def test_csv_cells_form_no_rows_and_no_formulas(
    named_runs: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, actual = named_runs
    table = tmp_path / "r.csv"
    code, _, _ = run_cli(["compare", str(golden), str(actual), "--csv", str(table)], capsys)
    assert code == 1
    raw = table.read_bytes()
    with table.open(newline="", encoding="utf-8") as fh:
        rows = list(csv.DictReader(fh))
    # one line per record: no CR or LF inside any cell, quoted or not
    assert raw.count(b"\n") == len(rows) + 1 and b"\r" not in raw
    # every cell quoted
    for line in raw.decode().splitlines():
        assert line.startswith('"') and line.endswith('"')
    modules = {r["module"] for r in rows}
    assert "a\\r=1+41" in modules  # the CR shown as an escape: one cell, one row
    assert "x;'=1+41;y" in modules
    # read as a ';'-separated or a tab-separated file, no cell is a formula
    for sep in (";", "\t", ",", "|"):
        for line in raw.decode().splitlines():
            for cell in line.split(sep):
                text = cell.strip().strip('"').strip()
                if text and text[0] in "=+-@":
                    float(text)  # a number (a negative bias) is a number, not a formula
