"""The checklist runner: loading, validation, errors, skips, ranking, outputs, exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import precguard
from precguard import plugins
from precguard.checklist import (
    Checklist,
    ChecklistError,
    Diagnosis,
    builtin_checklists,
    load_checklist,
    plan,
    rank_root_causes,
    registered_checks,
)
from precguard.checks import Check, Finding


def test_shipped_checklists_validate_and_name_registered_checks():
    assert {"llama-finetune", "llama-inference", "quick"} <= set(builtin_checklists())
    checks = registered_checks()
    for name in ("llama-finetune", "llama-inference", "quick"):
        steps = plan(load_checklist(name), checks)
        assert steps, name
    finetune = {c.id for c, _ in plan(load_checklist("llama-finetune"), checks)}
    inference = {c.id for c, _ in plan(load_checklist("llama-inference"), checks)}
    families = {i.split(".")[0] for i in finetune}
    assert families >= {"env", "rng", "data", "tokenizer", "norm", "rope", "attention", "ops"}
    assert families >= {"amp", "grads", "loss", "reduce", "layerwise"}
    assert not any(i.startswith(("amp.", "grads.")) for i in inference)
    assert {"rope.long_context", "attention.kv_cache"} <= inference


def test_top_level_checklists_dir_points_at_the_shipped_files():
    top = Path(__file__).parents[2] / "checklists"
    for name in ("llama-finetune", "llama-inference", "quick"):
        path = top / f"{name}.yaml"
        assert path.exists(), path
        assert load_checklist(path).name == name


def test_unknown_key_in_a_checklist_is_an_error(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndescription: y\nchecks: [rng.same_seed]\nseverity: high\n")
    with pytest.raises(ChecklistError, match="severity"):
        load_checklist(bad)
    bad.write_text("name: x\ndescription: y\nchecks:\n  - id: rng.same_seed\n    parms: {}\n")
    with pytest.raises(ChecklistError, match="parms"):
        load_checklist(bad)


def test_unknown_check_and_family_are_errors(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndescription: y\nchecks: [magic.thing]\n")
    with pytest.raises(ChecklistError, match="no plugin registers its family"):
        plan(load_checklist(bad), registered_checks())  # families are open: named at plan
    spec = Checklist.model_validate({"name": "x", "description": "y", "checks": ["rng.nope"]})
    with pytest.raises(ChecklistError, match=r"rng\.nope"):
        plan(spec, registered_checks())


def test_cli_rejects_a_bad_checklist_with_exit_2(tmp_path, capsys):
    from precguard.cli import main

    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ndescription: y\nchecks: [rng.same_seed]\ntypo: 1\n")
    with pytest.raises(SystemExit) as exc:
        main(["check", "--checklist", str(bad)])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "typo" in err[0]
    with pytest.raises(SystemExit) as exc:
        main(["check", "--checklist", "no-such-list"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["check", "--device", "nosuchchip:0"])
    assert exc.value.code == 2


class _RaisingPlugin:
    """A test plugin whose check raises, and one that returns a plain skip."""

    @plugins.hookimpl
    def precguard_register_checks(self, register):
        def boom(ctx):
            raise RuntimeError("kaboom")

        register(Check("ops.test_boom", "raises on purpose", boom, needs_target=False))


def test_a_check_that_raises_becomes_an_error_and_the_run_goes_on(tmp_path):
    plugin = _RaisingPlugin()
    plugins.load_plugins().register(plugin, name="test-raising")
    try:
        spec = tmp_path / "list.yaml"
        spec.write_text("name: boom\ndescription: test\nchecks: [ops.test_boom, env.fingerprint]\n")
        d = precguard.check(spec, None, device="cpu")
    finally:
        plugins.pm.unregister(plugin)
    statuses = {f.id: f.status for f in d.findings}
    assert statuses == {"ops.test_boom": "error", "env.fingerprint": "pass"}
    err = next(f for f in d.findings if f.id == "ops.test_boom")
    assert "kaboom" in err.summary
    assert d.verdict == "fail" and d.exit_code == 1


def test_a_check_that_cannot_apply_is_skipped_with_the_reason():
    from precguard import Target
    from precguard.targets import build_tiny_llama, lm_batch

    bare = Target(model=build_tiny_llama, batch=lm_batch, name="no-tokenizer")
    d = precguard.check("quick", bare, only=["tokenizer"])
    assert [f.status for f in d.findings] == ["skip"]
    assert "gives no tokenizer" in d.findings[0].summary


def test_only_and_skip_select_checks():
    checks = registered_checks()
    spec = load_checklist("llama-finetune")
    only = [c.id for c, _ in plan(spec, checks, only=["rope"])]
    assert only == ["rope.position_sweep"]
    rest = [c.id for c, _ in plan(spec, checks, skip=["rope", "env.*"])]
    assert "rope.position_sweep" not in rest and not any(i.startswith("env.") for i in rest)
    with pytest.raises(ChecklistError, match="--only"):
        plan(spec, checks, only=["rope.long_context"])


def test_each_family_is_one_module_of_its_own_checks():
    """FAMILIES is the one list: it names the built-in modules and orders the root causes."""
    import importlib

    from precguard.checks import FAMILIES
    from precguard.checks.builtin import FAMILY_MODULES

    assert len(FAMILY_MODULES) == len(FAMILIES)
    for family, module in zip(FAMILIES, FAMILY_MODULES, strict=True):
        checks = importlib.import_module(module).CHECKS
        assert checks and {c.family for c in checks} == {family}, module


def _f(check_id: str, status: str) -> Finding:
    return Finding(id=check_id, status=status, summary="s")


def test_root_causes_rank_failures_upstream_first():
    findings = [
        _f("grads.first_batch", "fail"),
        _f("reduce.order_sensitivity", "warn"),
        _f("norm.extreme_inputs", "fail"),
        _f("loss.init_value", "pass"),
        _f("ops.custom_modules", "error"),
        _f("rng.same_seed", "fail"),
    ]
    ranked = [f.id for f in rank_root_causes(findings)]
    assert ranked == [
        "rng.same_seed",
        "norm.extreme_inputs",
        "grads.first_batch",
        "ops.custom_modules",
        "reduce.order_sensitivity",
    ]


def test_clean_tiny_llama_passes_llama_finetune(run_check, tmp_path):
    html = tmp_path / "report.html"
    run = run_check("--checklist", "llama-finetune", "--target", "tiny-llama", "--html", str(html))
    assert run.code == 0, run.out
    assert run.statuses("error") == [] and run.statuses("fail") == []
    assert "verdict: PASS" in run.out
    d = Diagnosis.model_validate(run.diagnosis)
    assert d.verdict == "pass" and d.schema_version == 1
    page = html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "rope.position_sweep" in page


def test_clean_tiny_llama_passes_llama_inference(run_check):
    run = run_check("--checklist", "llama-inference", "--target", "tiny-llama")
    assert run.statuses("error") == [] and run.statuses("fail") == [], run.out
    # tiny-llama pads on the right; batched generation wants the left: a warning, not a failure
    assert run.finding("tokenizer.special_tokens")["status"] == "warn"
    assert run.finding("attention.kv_cache")["status"] == "pass"


def test_llama_finetune_on_emu_fp16_finds_the_fp16_pitfalls(run_check):
    run = run_check(
        "--checklist", "llama-finetune", "--target", "tiny-llama", "--device", "emu:fp16"
    )
    assert run.code == 1 and run.statuses("error") == []
    # emu:fp16 rounds every op, fp32 code included (like Ascend's allow_fp32_to_fp16):
    # HF's norm variance overflows and its rotary angles lose precision.
    assert {"norm.extreme_inputs", "rope.position_sweep"} <= set(run.statuses("fail"))
    assert run.diagnosis["compute_dtype"] == "float16"


def test_json_to_stdout(tmp_path, capsys):
    from precguard.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["check", "--checklist", "quick", "--only", "env", "--json", "-"])
    assert exc.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["checklist"] == "quick" and data["verdict"] == "pass"
    assert data["dtype"] == "float32"
    assert data["compute_dtype"] is None  # only reported once a check has measured it


def test_a_misspelt_check_parameter_is_an_error(tmp_path):
    spec = tmp_path / "list.yaml"
    spec.write_text(
        "name: x\ndescription: y\nchecks:\n  - id: rope.position_sweep\n    params: {max_pos: 8}\n"
    )
    with pytest.raises(ChecklistError, match=r"max_pos.*takes: max_position"):
        plan(load_checklist(spec), registered_checks())


def test_list_shows_builtin_and_vendor_checks(capsys):
    from precguard.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["check", "--list"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "rope.position_sweep" in out and "env.ascend_precision_mode" in out
    assert "checklists: fp8, llama-finetune, llama-inference, quick, serving" in out


def test_html_escapes_what_the_model_names(run_check, plugin_checklist, tmp_path):
    finding = Finding(id="ops.vendor_kernel", status="fail", summary="<script>x</script>")
    html = tmp_path / "report.html"
    run = run_check("--checklist", str(plugin_checklist(finding)), "--html", str(html))
    assert run.diagnosis["root_causes"] == [finding.model_dump(mode="json")] and run.code == 1
    page = html.read_text(encoding="utf-8")
    # the page's one script is its own (table sorting); the finding's is text
    assert "<script>x</script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page
    assert page.count("<script") == 1


def test_a_target_that_cannot_be_built_is_unusable_input(run_check):
    from tests.checks.conftest import planted

    run = run_check("--target", planted("broken_model"))
    assert run.code == 2
    lines = run.err.strip().splitlines()
    assert len(lines) == 1 and "checkpoint shard 3 is missing" in lines[0]


def test_the_example_script_and_checklist_run(tmp_path):
    import importlib.util

    path = Path(__file__).parents[2] / "examples" / "checklist" / "diagnose.py"
    spec = importlib.util.spec_from_file_location("diagnose_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    out = tmp_path / "d.json"
    assert module.main("emu:bf16", str(out)) == 1
    d = Diagnosis.model_validate_json(out.read_text())
    assert d.root_cause is not None and d.root_cause.id == "rope.position_sweep"
    assert module.main("cpu") == 0
