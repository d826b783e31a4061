"""``precguard generate-diff`` from the command line: exit codes, JSON, HTML, saved runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precguard import GenerationDiff
from precguard.cli import main

TARGETS = Path(__file__).with_name("targets.py")


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(["generate-diff", *args])
    out, err = capsys.readouterr()
    code = exc.value.code
    return (code if isinstance(code, int) else 0), out, err


def test_a_planted_fault_exits_1_with_the_layer_in_the_json_and_a_page(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("The quick brown fox\n", encoding="utf-8")
    args = [
        "--target", f"{TARGETS}:scaled", "--reference-target", f"{TARGETS}:peaked",
        "--device", "cpu", "--prompts", str(prompts), "-n", "6",
        "--json", str(tmp_path / "gen.json"), "--html", str(tmp_path / "gen.html"),
    ]  # fmt: skip
    code, out, _ = run(args, capsys)
    assert code == 1
    assert "divergence at step" in out and "model.layers.2.mlp.down_proj" in out
    data = json.loads((tmp_path / "gen.json").read_text())
    fd = data["prompts"][0]["first_divergence"]
    assert set(fd) >= {"step", "golden_token", "actual_token", "golden_margin", "actual_margin"}
    assert fd["kind"] == "divergence"
    assert data["layerwise"]["first_divergence"]["module"] == "model.layers.2.mlp.down_proj"
    assert data["summary"]["diverged"] == 1 and len(data["prompts"][0]["kl"]) == 6
    GenerationDiff.model_validate(data)  # the file reads back as the documented model
    page = (tmp_path / "gen.html").read_text()
    assert "class='diff'" in page and "<svg" in page and "KL divergence" in page


def test_near_ties_only_exit_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["--target", f"{TARGETS}:near_tie", "--device", "emu:bf16-mixed", "-n", "2",
            "--prompts", str(_one_prompt(tmp_path)), "--json", "-"]  # fmt: skip
    code, out, err = run(args, capsys)
    assert code == 0
    data = json.loads(out)
    assert data["verdict"] == "near-ties" and data["layerwise"] is None
    assert "near-tie at step 0" in err  # the summary goes to stderr when JSON takes stdout


def test_unusable_input_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"text": "ok"}\nnot json\n', encoding="utf-8")
    code, _, err = run(["--device", "cpu", "--prompts", str(bad)], capsys)
    assert code == 2 and "line 2" in err and "Traceback" not in err
    code, _, err = run([], capsys)
    assert code == 2 and "--device" in err
    code, _, err = run(["--device", "cpu", "-n", "0"], capsys)
    assert code == 2 and "max-new-tokens" in err


def test_a_reference_on_another_machine_saved_runs_then_compared(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden, actual = tmp_path / "golden", tmp_path / "actual"
    prompts = str(_one_prompt(tmp_path))
    code, _, _ = run(["-t", f"{TARGETS}:peaked", "--device", "cpu", "--save-run", str(golden),
                      "--prompts", prompts, "-n", "6"], capsys)  # fmt: skip
    assert code == 0 and (golden / "generation.json").is_file()
    code, _, _ = run(["-t", f"{TARGETS}:scaled", "--device", "cpu", "--save-run", str(actual),
                      "--against", str(golden)], capsys)  # fmt: skip
    assert code == 0 and any((actual / "layerwise").iterdir())
    # nothing the user had is overwritten
    code, _, err = run(["-t", f"{TARGETS}:peaked", "--device", "cpu", "--save-run", str(golden)],
                       capsys)  # fmt: skip
    assert code == 2 and "not empty" in err
    out_json = tmp_path / "sep.json"
    code, out, _ = run([str(golden), str(actual), "-t", f"{TARGETS}:peaked", "--reference", "cpu",
                        "--json", str(out_json)], capsys)  # fmt: skip
    assert code == 1
    data = json.loads(out_json.read_text())
    assert data["golden"]["saved"] == str(golden)
    assert data["layerwise"]["first_divergence"]["module"] == "model.layers.2.mlp.down_proj"
    # without the golden's replay the report says how to get it
    code, out, _ = run([str(golden), str(actual)], capsys)
    assert code == 1 and "--reference" in out


def test_the_json_schema_documents_the_report(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["schema", "generation"])  # what a consumer of --json reads
    assert exc.value.code in (0, None)
    schema = json.loads(capsys.readouterr().out)
    assert {"prompts", "summary", "layerwise", "verdict"} <= set(schema["properties"])
    divergence = schema["$defs"]["TokenDivergence"]["properties"]
    assert divergence["kind"]["enum"] == ["near-tie", "divergence"]
    assert all("description" in p for p in divergence.values())


def _one_prompt(tmp_path: Path) -> Path:
    path = tmp_path / "one.jsonl"
    path.write_text(json.dumps({"text": "The quick brown fox"}) + "\n", encoding="utf-8")
    return path


def test_a_tampered_saved_run_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = tmp_path / "golden"
    code, _, _ = run(["-t", f"{TARGETS}:peaked", "--device", "cpu", "--save-run", str(golden),
                      "--prompts", str(_one_prompt(tmp_path)), "-n", "2"], capsys)  # fmt: skip
    assert code == 0
    meta = json.loads((golden / "generation.json").read_text())
    meta["prompts"][0]["chosen"] = [10**9, 1]
    (golden / "generation.json").write_text(json.dumps(meta))
    code, _, err = run([str(golden), str(golden)], capsys)
    assert code == 2 and "token id outside" in err
    meta["prompts"][0]["surprise"] = 1
    (golden / "generation.json").write_text(json.dumps(meta))
    code, _, err = run([str(golden), str(golden)], capsys)
    assert code == 2 and "surprise" in err


def test_saved_runs_without_prompts_are_refused_not_a_match(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    golden = tmp_path / "golden"
    code, _, _ = run(["-t", f"{TARGETS}:peaked", "--device", "cpu", "--save-run", str(golden),
                      "--prompts", str(_one_prompt(tmp_path)), "-n", "2"], capsys)  # fmt: skip
    assert code == 0
    meta = json.loads((golden / "generation.json").read_text())
    meta["prompts"] = []
    (golden / "generation.json").write_text(json.dumps(meta))
    code, out, err = run([str(golden), str(golden)], capsys)
    assert code == 2 and "nothing was compared" in err and "match" not in out
