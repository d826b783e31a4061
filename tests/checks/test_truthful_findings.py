"""Findings tell the truth: no failure for what the model does not do, no pass on nothing.

Each test is a user's run that used to mislead: a loss failed for label
smoothing the model never uses, a remedy on a PASS row, a remedy whose scale
overflows, a data check that compared no input, a fingerprint check against a
golden that has none, a run where every check skipped ending green.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.checks.conftest import planted


def handmade(name: str) -> str:
    return f"{Path(__file__).with_name('handmade.py')}:{name}"


def test_the_targets_own_loss_is_checked_not_label_smoothing_it_does_not_use(run_check):
    run = run_check(
        "--target", "tiny-llama", "--device", "emu:fp16", "--only", "loss.cross_entropy"
    )
    found = run.finding("loss.cross_entropy")
    assert found["status"] == "pass", found
    assert "the target's loss" in found["summary"]
    cases = found["evidence"]["cases"]
    assert set(cases["target_loss"]) == {"target_batch", "ignore_index"}
    assert not any("smoothing" in k for k in cases)


def test_a_loss_that_casts_logits_to_fp16_fails_against_the_oracle(run_check):
    clean = run_check("--target", handmade("clean"), "--only", "loss.cross_entropy")
    assert clean.finding("loss.cross_entropy")["status"] == "pass"
    run = run_check("--target", handmade("loss_in_fp16"), "--only", "loss.cross_entropy")
    found = run.finding("loss.cross_entropy")
    assert found["status"] == "fail", found
    assert found["remedy"]


def test_label_smoothing_is_tested_when_the_checklist_asks(run_check, tmp_path):
    checklist = tmp_path / "smooth.yaml"
    checklist.write_text(
        "name: smooth\ndescription: d\nchecks:\n"
        "  - id: loss.cross_entropy\n    params: {smoothing: 0.1}\n"
    )
    run = run_check("--checklist", str(checklist), "--target", "tiny-llama")
    found = run.finding("loss.cross_entropy")
    assert found["status"] == "pass"
    assert "F.cross_entropy:label_smoothing" in found["evidence"]["cases"]


def test_the_loss_scale_remedy_is_a_scale_that_worked_here(run_check):
    """init_scale=2**16 overflows under emulated fp16; the remedy names the scale found finite."""
    run = run_check(
        "--target", planted("fp16_no_loss_scaling"), "--device", "emu:fp16", "--only", "amp"
    )
    found = run.finding("amp.loss_scaling")
    assert found["status"] == "fail"
    tried = found["evidence"]["scale_tried"]
    assert found["evidence"]["overflow_skips_before_finite"] >= 1 and tried < 2**16
    scale = 2 ** round(math.log2(tried))  # evidence rounds to 4 significant digits
    assert f"init_scale={scale}" in found["remedy"] and "2**16" not in found["remedy"]


def test_skipping_every_check_is_inconclusive_not_a_pass(run_check):
    run = run_check("--target", "tiny-llama", "--skip", "*")
    assert run.code == 3
    assert run.diagnosis["verdict"] == "inconclusive" and run.diagnosis["findings"] == []
    assert "INCONCLUSIVE" in run.out and "PASS" not in run.out


def test_a_checklist_whose_checks_all_skip_is_inconclusive(run_check):
    # the hand-written decoder has no tokenizer and no golden is given: every check skips
    run = run_check("--target", handmade("clean"), "--only", "tokenizer")
    assert run.statuses("skip") and not run.statuses("pass")
    assert run.code == 3 and run.diagnosis["verdict"] == "inconclusive"
    assert "all 4 checks were skipped" in run.out


def test_one_check_with_a_result_makes_the_run_conclusive(run_check):
    run = run_check("--target", handmade("clean"), "--only", "tokenizer", "--only", "env")
    assert run.statuses("skip") and run.statuses("pass")
    assert run.code == 0 and run.diagnosis["verdict"] == "pass"


@pytest.mark.slow
def test_the_cli_exits_3_when_nothing_was_checked():
    proc = subprocess.run(
        [sys.executable, "-m", "precguard", "check", "--skip", "*"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    assert "INCONCLUSIVE" in proc.stdout and proc.stderr.strip() == ""


@pytest.fixture(scope="module")
def tuple_golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hand-written decoder recorded with ``model(*(ids,))``: inputs named ``args.0``."""
    from precguard import record_target

    out = tmp_path_factory.mktemp("golden") / "tuple"
    return record_target(handmade("tuple_batch"), device="cpu", out=out, steps=2)


@pytest.fixture(scope="module")
def keyword_golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The hand-written decoder recorded with ``model(ids=...)``: inputs named ``kwargs.ids``."""
    from precguard import record_target

    out = tmp_path_factory.mktemp("golden") / "keyword"
    return record_target(handmade("dict_batch"), device="cpu", out=out, steps=2)


def test_positional_golden_inputs_are_mapped_to_keyword_inputs(run_check, tuple_golden):
    run = run_check(
        "--target", handmade("dict_batch"), "--golden", str(tuple_golden), "--only", "data"
    )
    found = run.finding("data.batches")
    assert found["status"] == "pass", found
    assert found["evidence"]["golden_inputs"] == ["args.0"]
    assert found["evidence"]["paired_inputs"] == ["kwargs.ids"]
    assert found["evidence"]["golden_steps_compared"] == 2


def test_a_positional_golden_maps_through_the_forward_signature_both_ways(
    run_check, keyword_golden
):
    run = run_check(
        "--target", handmade("clean"), "--golden", str(keyword_golden), "--only", "data"
    )
    found = run.finding("data.batches")
    assert found["status"] == "pass", found
    assert found["evidence"]["paired_inputs"] == ["args.0"]


def test_golden_inputs_that_pair_with_nothing_are_not_comparable_not_a_pass(
    run_check, keyword_golden
):
    # tiny-llama's forward has no `ids`: the decoder's kwargs.ids pairs with nothing
    run = run_check("--target", "tiny-llama", "--golden", str(keyword_golden), "--only", "data")
    found = run.finding("data.batches")
    assert found["status"] == "warn", found
    assert "cannot be compared" in found["summary"]
    assert found["evidence"]["golden_steps_compared"] == 0
    assert found["evidence"]["paired_inputs"] == []


def test_a_golden_with_an_empty_fingerprint_is_named(run_check, tuple_golden, tmp_path):
    import json
    import shutil

    golden = tmp_path / "no-fingerprint"
    shutil.copytree(tuple_golden, golden)
    manifest = json.loads((golden / "manifest.json").read_text())
    manifest["fingerprint"] = {}
    (golden / "manifest.json").write_text(json.dumps(manifest))
    run = run_check("--golden", str(golden), "--only", "env.fingerprint")
    found = run.finding("env.fingerprint")
    assert found["status"] == "warn"
    assert "has no environment fingerprint" in found["summary"]
    assert found["evidence"]["golden_keys_compared"] == 0
    # the same golden with its fingerprint compares every key and passes
    intact = run_check("--golden", str(tuple_golden), "--only", "env.fingerprint")
    assert intact.finding("env.fingerprint")["status"] == "pass"
    assert intact.finding("env.fingerprint")["evidence"]["golden_keys_compared"] > 0


def test_a_mapped_input_holding_other_data_fails(run_check, tuple_golden):
    # tiny-llama's forward takes input_ids first: the golden's args.0 pairs with it, and differs
    run = run_check("--target", "tiny-llama", "--golden", str(tuple_golden), "--only", "data")
    found = run.finding("data.batches")
    assert found["status"] == "fail"
    assert found["evidence"]["paired_inputs"] == ["kwargs.input_ids"]


def test_the_quick_checklist_raises_no_failure_on_the_builtin_target(run_check):
    run = run_check("--checklist", "quick", "--target", "tiny-llama")
    assert run.statuses("fail") == [] and run.statuses("error") == [], run.out
    assert run.code == 0


def test_the_html_report_says_inconclusive(run_check, tmp_path):
    html = tmp_path / "report.html"
    run = run_check("--checklist", "quick", "--skip", "*", "--html", str(html))
    assert run.diagnosis["verdict"] == "inconclusive" and run.code == 3
    page = html.read_text(encoding="utf-8")
    assert "INCONCLUSIVE" in page and "nothing was shown to pass" in page


def test_a_remedy_a_plugin_puts_on_a_pass_is_not_shown(run_check, plugin_checklist, tmp_path):
    from precguard.checks import Finding

    # built by hand, not with finding() (which drops it): the remedy stays on the pass
    passed = Finding(id="env.vendor_flag", status="pass", summary="ok", remedy="flip the flag")
    html = tmp_path / "report.html"
    run = run_check("--checklist", str(plugin_checklist(passed)), "--html", str(html))
    assert run.diagnosis["findings"] == [passed.model_dump(mode="json")] and run.code == 0
    assert "flip the flag" not in html.read_text(encoding="utf-8")


def test_norms_that_cannot_be_rerun_alone_are_not_a_pass(run_check):
    run = run_check("--target", handmade("two_input_norm"), "--only", "norm")
    found = run.finding("norm.extreme_inputs")
    assert found["status"] == "skip", found
    assert "could be re-run alone" in found["summary"] and "add_norm" in found["summary"]
    assert run.code == 3


def test_a_layerwise_match_over_no_paired_record_is_not_a_pass(monkeypatch, tuple_golden):
    """compare's 'match' when every record went unmatched compared nothing."""
    from types import SimpleNamespace

    import precguard
    import precguard.compare
    import precguard.runner

    nothing = SimpleNamespace(
        verdict="match",
        counts={"passed": 0, "failed": 0, "nonfinite": 0, "missing": 12},
        profile="default",
        first_divergence=None,
        suspects=[],
    )
    monkeypatch.setattr(precguard.runner, "record_target", lambda *a, **k: None)
    monkeypatch.setattr(precguard.compare, "compare_recordings", lambda *a, **k: nothing)
    d = precguard.check(
        "llama-finetune", handmade("tuple_batch"), golden=tuple_golden, only=["layerwise"]
    )
    (found,) = d.findings
    assert found.status == "warn" and "nothing was compared" in found.summary
    assert d.verdict == "pass"  # a warning, not a failure: but never a PASS row for it
