"""Files anyone can hand the tools: refused in one line before they exhaust anything."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import precguard
from precguard import DumpFormatError, Run, UsageError
from precguard.layout.spec import MAX_LAYOUT_BYTES, load_layout
from tests.compare.conftest import run_cli


@pytest.fixture
def recording(tmp_path: Path) -> Path:
    model = torch.nn.Linear(4, 4)
    with precguard.monitor(model, out=tmp_path / "run"):
        model(torch.ones(1, 4))
    return tmp_path / "run"


def test_a_manifest_claiming_a_hundred_million_ranks_is_refused(recording: Path) -> None:
    manifest = recording / "manifest.json"
    raw = json.loads(manifest.read_text())
    raw["world_size"] = 10**8
    manifest.write_text(json.dumps(raw))
    # the bound is the reader's (1..2**17 ranks): the message names the claim and the range
    with pytest.raises(DumpFormatError, match=r"world_size 100000000 is outside 1\.\.\d+"):
        Run(recording)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("- " * 10_000 + "x", "nested deeper"),
        # libyaml's own parser stops flow nesting first: one line either way
        ("[" * 10_000 + "]" * 10_000, "nested deeper|nesting depth"),
        ("rules: &a [*a]\n", "aliases are not allowed"),
        ("x: " + "a" * (MAX_LAYOUT_BYTES + 1), "larger than"),
    ],
    ids=["deep-block", "deep-flow", "alias", "huge"],
)
def test_a_hostile_layout_is_one_usage_error(tmp_path: Path, text: str, says: str) -> None:
    spec = tmp_path / "layout.yaml"
    spec.write_text(text)
    with pytest.raises(UsageError, match=says):
        load_layout(spec)


def test_shipped_layouts_still_load() -> None:
    assert load_layout("megatron").rule_for("decoder.layers.0.mlp.linear_fc1") is not None


def _saved_comparison(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Path:
    runs = []
    for side, scale in (("g", 1.0), ("a", 1.01)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
        model[0].register_forward_hook(lambda _m, _a, y, s=scale: y * s)
        with torch.no_grad(), precguard.monitor(model, out=tmp_path / side):
            model(torch.ones(2, 4))
        runs.append(str(tmp_path / side))
    result = tmp_path / "result.json"
    run_cli(["compare", *runs, "--json", str(result)], capsys)
    return result


def test_report_opens_the_paths_a_result_names_only_when_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _saved_comparison(tmp_path, capsys)
    page = tmp_path / "r.html"
    code, _, err = run_cli(["report", str(result), "--html", str(page)], capsys)
    assert code == 0, err
    assert "statistics per layer not drawn" in page.read_text(encoding="utf-8")
    code, _, err = run_cli(["report", str(result), "--html", str(page), "--recordings"], capsys)
    assert code == 0, err
    assert "statistics per layer not drawn" not in page.read_text(encoding="utf-8")


def test_report_refuses_an_unknown_schema_version(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result = _saved_comparison(tmp_path, capsys)
    raw = json.loads(result.read_text())
    raw["schema_version"] = 999
    result.write_text(json.dumps(raw))
    code, _, err = run_cli(["report", str(result), "--html", str(tmp_path / "r.html")], capsys)
    assert code == 2
    assert "schema_version 999" in err and "Traceback" not in err


def test_evidence_naming_thousands_of_modules_renders_a_bounded_page() -> None:
    from precguard.report.evidence import MAX_PLOT_LAYERS, MAX_ROWS, evidence_plots, render_value

    names = [f"model.layers.{i}" for i in range(5000)]
    sides = {"device": dict.fromkeys(names, 1.0), "reference": dict.fromkeys(names, 2.0)}
    page = render_value(sides)
    assert page.count("<tr>") <= MAX_ROWS + 1 and "4800 more" in page
    per_layer = {"layers": {n: {"grad_norm": 1.0 + i} for i, n in enumerate(names)}}
    (svg,) = evidence_plots(per_layer)
    assert f"first {MAX_PLOT_LAYERS} of 5000 layers drawn" in svg
    assert names[MAX_PLOT_LAYERS] not in svg
