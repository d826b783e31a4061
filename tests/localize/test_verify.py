"""Remedies verified by re-running the actual side (issue 32).

Each remedy a finding names is applied mechanically and the output error
measured again; the floor it must reach is that of the clean model run the
same way (tests/localize/impact_corpus.py:clean).
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest

import precguard
from precguard import Switch, hookimpl, plugins
from precguard.compare import RemedyCheck, chosen
from precguard.localize.impact import FLOOR_SLACK, ActualSide, error_budget, judge_remedy
from precguard.localize.verify import loss_remedy, switch_remedies, verify_remedies
from tests.localize.cli import precguard_cli
from tests.localize.impact_corpus import DEVICE, side

CORPUS = "tests/localize/impact_corpus.py:"


@pytest.fixture(scope="module")
def clean_floor() -> float:
    """The output error of the clean model on the same device: a correct bf16 run."""
    return side("clean").output_error()


def _remedies(name: str, modules: list[str]):
    actual = side(name)
    budget = verify_remedies(actual, error_budget(actual, [(m, "finding") for m in modules]))
    return budget, {(i.module, r.remedy): r for i in budget.impacts for r in i.remedies}


def test_the_rotary_bug_is_fixed_by_float32_angles_not_by_float32_buffers(clean_floor) -> None:
    _, remedies = _remedies("rope_bug", ["model.rotary_emb"])
    angles = remedies[("model.rotary_emb", "float32-compute")]
    assert angles.verdict == "verified" and "angles in float32" in angles.summary
    assert angles.after <= FLOOR_SLACK * clean_floor < angles.before
    assert "verified: output error" in angles.describe()
    # the bug computes the angles in the activation dtype: fp32 buffers cannot help, and say so
    buffers = remedies[("model.rotary_emb", "float32-buffers")]
    assert buffers.verdict == "did not help"


def test_the_projection_fault_is_fixed_at_reference_precision(clean_floor) -> None:
    _, remedies = _remedies("projection_bug", ["model.layers.1.self_attn.v_proj"])
    fix = remedies[("model.layers.1.self_attn.v_proj", "reference-precision")]
    assert fix.verdict == "verified" and fix.after <= FLOOR_SLACK * clean_floor


def test_two_faults_each_remedy_helps_partly() -> None:
    budget, remedies = _remedies(
        "two_bugs", ["model.rotary_emb", "model.layers.1.self_attn.v_proj"]
    )
    assert remedies[("model.rotary_emb", "reference-precision")].verdict == "partial"
    assert remedies[("model.layers.1.self_attn.v_proj", "reference-precision")].verdict == (
        "partial"
    )
    assert budget.together <= FLOOR_SLACK * budget.floor


def test_hf_inv_freq_kept_in_float32_reaches_the_floor() -> None:
    _, remedies = _remedies("clean", ["model.rotary_emb"])
    buffers = remedies[("model.rotary_emb", "float32-buffers")]
    assert "inv_freq" in buffers.summary
    assert buffers.after < buffers.before and buffers.after <= FLOOR_SLACK * buffers.floor


def test_a_norm_in_bf16_that_costs_nothing_says_its_remedy_cannot_help(clean_floor) -> None:
    budget, remedies = _remedies("norm_bug", ["model.layers.2.post_attention_layernorm"])
    stats = remedies[("model.layers.2.post_attention_layernorm", "float32-compute")]
    assert "statistics in float32" in stats.summary
    # the output is within the floor already: the remedy is not needed, never "did not help"
    assert stats.verdict == "not needed" and "within the floor" in stats.describe()
    assert budget.output_error <= FLOOR_SLACK * clean_floor


def test_a_remedy_that_reaches_the_floor_is_never_said_not_to_help() -> None:
    """Issue 39: "did not help: 0.0158 -> 0.0134, the floor is 0.0134" read as a failed fix."""
    assert judge_remedy(0.0158, 0.0134, 0.0134) == "not needed"  # within the floor already
    assert judge_remedy(0.0603, 0.0134, 0.0134) == "verified"
    assert judge_remedy(0.0603, 0.0603, 0.0134) == "did not help"
    assert judge_remedy(0.0603, 0.03, 0.0134) == "partial"
    for before in (0.0134, 0.016, 0.0603, 1.0):
        assert judge_remedy(before, 0.0134, 0.0134) != "did not help"


def _check(remedy: str, verdict: str, after: float) -> RemedyCheck:
    return RemedyCheck(
        remedy=remedy, summary=remedy, before=0.06, after=after, floor=0.0134, verdict=verdict
    )


def test_compare_names_the_remedy_verification_chose() -> None:
    """The first verified remedy in the candidates' order (the smallest change) is the one
    compare prints; a refuted one is never chosen."""
    buffers = _check("float32-buffers", "did not help", 0.06)
    angles = _check("float32-compute", "verified", 0.0134)
    whole = _check("reference-precision", "verified", 0.0130)
    assert chosen([whole, buffers, angles]) == angles
    assert chosen([buffers]) is None
    partly = _check("reference-precision", "partial", 0.03)
    assert chosen([buffers, partly]) == partly


def test_the_loss_on_float32_logits_is_verified() -> None:
    check = loss_remedy(side("loss_bug"))
    assert check.verdict == "verified" and check.after < check.before


class _FlagPlugin:
    """A vendor plugin declaring a switch for its device, set by a context manager."""

    def __init__(self) -> None:
        self.entered: list[str] = []

    @hookimpl
    def precguard_register_switches(self, register) -> None:
        @contextlib.contextmanager
        def high_precision():
            self.entered.append("on")
            yield

        register(Switch("test-hp-mode", ["emu:bf16*"], "high-precision mode", apply=high_precision))


def test_a_plugins_switch_is_run_and_judged() -> None:
    plugin = _FlagPlugin()
    plugins.load_plugins()
    plugins.pm.register(plugin, name="test-switch-plugin")
    try:
        clean = side("clean")
        checks = {c.remedy: c for c in switch_remedies(clean, floor=clean.output_error())}
    finally:
        plugins.pm.unregister(plugin, name="test-switch-plugin")
    assert plugin.entered == ["on"]
    mine = checks["switch:test-hp-mode"]
    # the flag changes nothing on the emulator: the error is the same, and (the floor given
    # is the error itself) said to need no remedy, never "did not help"
    assert mine.after == mine.before and mine.verdict == "not needed"


def test_emu_declares_its_profiles_as_switches() -> None:
    names = {s.name for s in plugins.collect_switches("emu:bf16-lowacc")}
    assert names == {"emu-bf16-fp32-accumulate"}
    assert {s.instead for s in plugins.collect_switches("emu:bf16")} == {"emu:bf16-mixed"}


@pytest.mark.slow
def test_compare_verify_prints_the_verified_remedy(tmp_path: Path) -> None:
    golden = precguard.record_target(CORPUS + "rope_bug", device="cpu", out=tmp_path / "cpu")
    actual = precguard.record_target(CORPUS + "rope_bug", device=DEVICE, out=tmp_path / "bf16")
    out = precguard_cli(
        *("compare", str(golden), str(actual)),
        *("--target", CORPUS + "rope_bug", "--verify", "--json", str(tmp_path / "c.json")),
        *("--html", str(tmp_path / "c.html")),
    )
    assert out.returncode == 1, out.stderr
    said = " ".join(out.stdout.split())  # wrapped at the terminal's width, never cut
    assert (
        "model.rotary_emb: compute the rotary frequencies and angles in float32: verified" in said
    )
    report = json.loads((tmp_path / "c.json").read_text())
    impact = report["impact"]
    # one source of advice: the first divergence's remedy is the one the re-run verified
    chosen = report["first_divergence"]["remedy"]
    assert chosen["remedy"] == "float32-compute" and chosen["verdict"] == "verified"
    assert impact["impacts"][0]["module"] == "model.rotary_emb"
    assert any(r["verdict"] == "verified" for r in impact["impacts"][0]["remedies"])
    assert "Impact on the output error" in (tmp_path / "c.html").read_text()


@pytest.mark.slow
def test_check_verify_tells_which_of_the_checks_remedies_works(tmp_path: Path) -> None:
    """The rope check blames the angles and the rounded inv_freq; re-running says which."""
    out = precguard_cli(
        *("check", "--target", CORPUS + "rope_bug"),
        *("--device", DEVICE, "--only", "rope.position_sweep", "--verify"),
        *("--json", str(tmp_path / "d.json"), "--html", str(tmp_path / "d.html")),
    )
    assert out.returncode == 1, out.stderr
    impact = json.loads((tmp_path / "d.json").read_text())["impact"]
    (rotary,) = impact["impacts"]
    assert rotary["module"] == "model.rotary_emb" and rotary["found_by"] == ["rope.position_sweep"]
    verdicts = {r["remedy"]: r["verdict"] for r in rotary["remedies"]}
    assert verdicts["float32-compute"] == "verified"
    assert verdicts["float32-buffers"] == "did not help"
    assert "Impact on the output error" in (tmp_path / "d.html").read_text()


def test_a_switch_to_the_mixed_profile_runs_in_its_storage_dtype() -> None:
    """emu:bf16 keeps float32 tensors; its switch to emu:bf16-mixed must run in bf16 as
    ``record -d emu:bf16-mixed`` would (in float32 it rounded nothing: an error of 0)."""
    actual = ActualSide.open(precguard.Side("tiny-llama", "emu:bf16"))
    (mixed,) = [c for c in switch_remedies(actual, floor=None) if "emu:bf16-mixed" in c.summary]
    assert mixed.after is not None and 0 < mixed.after < mixed.before
