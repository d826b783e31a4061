"""A vendor plugin brings its own check family: checklists take it, and it ranks last."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

import precguard
from precguard import UsageError

VENDOR_PLUGIN = """
from precguard import hookimpl
from precguard.checks import Check, finding


def fused_rmsnorm(ctx):
    return finding("npuops.fused_rmsnorm", "fail", "the fused RMSNorm kernel drops eps",
                   remedy="set NPU_FUSED_RMSNORM=0")


def loss_probe(ctx):
    return finding("loss.vendor_probe", "fail", "the loss is summed in fp16",
                   remedy="compute the loss in fp32")


@hookimpl
def precguard_register_checks(register):
    register(Check("npuops.fused_rmsnorm", "fused kernels keep eps", fused_rmsnorm, False))
    register(Check("loss.vendor_probe", "the loss in fp32", loss_probe, False))
"""


def test_a_plugins_new_family_runs_and_ranks_after_the_built_in_ones(
    install_plugin: Callable[[str, str], None], tmp_path: Path
) -> None:
    install_plugin("npuvendor", VENDOR_PLUGIN)
    checklist = tmp_path / "vendor.yaml"
    checklist.write_text(
        "name: vendor\ndescription: the vendor's checks first\n"
        "checks: [npuops.*, loss.vendor_probe, env.fingerprint]\n"
    )
    diagnosis = precguard.check(checklist, None, device="cpu")
    assert [f.id for f in diagnosis.findings][:2] == ["npuops.fused_rmsnorm", "loss.vendor_probe"]
    # it ran first, but precguard cannot know what a vendor family explains: it ranks last
    assert [f.id for f in diagnosis.root_causes] == ["loss.vendor_probe", "npuops.fused_rmsnorm"]
    assert diagnosis.verdict == "fail" and diagnosis.exit_code == 1


def test_a_family_no_plugin_registers_is_named_when_the_checklist_is_planned(
    fresh_plugins: None, tmp_path: Path
) -> None:
    checklist = tmp_path / "vendor.yaml"
    for entry in ("npuops.fused_rmsnorm", "rop.*"):  # a plugin not installed; a typo
        checklist.write_text(f"name: vendor\ndescription: d\nchecks: ['{entry}']\n")
        # any lowercase family loads (plugins bring their own): planning names the gap
        with pytest.raises(UsageError, match=r"no plugin registers its family.*env, fp8, grads"):
            precguard.check(checklist, None, device="cpu")


@pytest.mark.parametrize("bad", ["npuops", "NPU.ops", "npuops.", ".x"])
def test_a_check_id_without_a_family_is_refused(bad: str, tmp_path: Path) -> None:
    checklist = tmp_path / "bad.yaml"
    checklist.write_text(f"name: x\ndescription: y\nchecks: [{bad!r}]\n")
    with pytest.raises(UsageError, match=r"family\.name"):
        precguard.check(checklist, None, device="cpu")
