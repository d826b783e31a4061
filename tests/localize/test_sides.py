"""bisect, the error budget and verify say both sides as ``precguard.Side`` s (issue 30).

The user's story: a model is fine on a chip until a set-up step (the Side's
``prepare``, here one RMS norm that scales its input by 100 first) makes it
overflow in fp16. They say the device under test as one Side and the trusted
reference as another (``golden=``), and every localizing tool (bisect, op-check's
``--verify``, check's ``--verify``, compare's ``--target``) re-runs exactly what
the two Sides say: the fault is found only when the actual Side carries it, and
the golden's device and dtype are the reference the error is measured against.
Saying a side twice (a Side and the older keyword for it) is a usage error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from torch import nn

import precguard
from precguard import Side, UsageError, verify
from precguard.checks import Finding
from precguard.localize.impact import ActualSide, comparison_sides
from tests.localize.cli import precguard_cli

FINE = "tests/localize/models.py:fine"
NORM = "blocks.2.norm"


def plant(model: nn.Module) -> None:
    """Block 2's norm scales its input by 100 first: its squares overflow in fp16."""
    model.blocks[2].norm.scale = 100.0


PLANTED = Side(FINE, "emu:fp16", prepare=plant)
CLEAN = PLANTED.replace(prepare=None)
FLAGGED = [
    Finding(
        id="norm.overflow",
        status="fail",
        summary="a norm's squares overflow",
        evidence={"module": NORM},
    )
]


# -- bisect ----------------------------------------------------------------------------------


def test_bisect_finds_the_fault_the_actual_side_plants_and_only_then() -> None:
    found = precguard.bisect(PLANTED, golden=Side(FINE))
    assert found.culprits == [NORM] and found.exit_code == 1
    assert (found.reference, found.reference_dtype) == ("cpu", "float32")
    clean = precguard.bisect(CLEAN, golden=Side(FINE))
    assert clean.culprits == [] and clean.exit_code == 0


def test_bisect_measures_against_the_golden_sides_dtype() -> None:
    """The same planted model in fp16 on the CPU: against a float32 golden the norm is
    the culprit; against a float16 golden on the same device the outputs are the same
    bits, so there is nothing to fix."""
    actual = Side(FINE, "cpu", "float16", prepare=plant)
    against_fp32 = precguard.bisect(actual, golden=Side(FINE, "cpu", "float32"))
    assert against_fp32.culprits == [NORM]
    against_fp16 = precguard.bisect(actual, golden=Side(FINE, "cpu", "float16"))
    assert against_fp16.reference_dtype == "float16"
    assert against_fp16.baseline_error == 0.0 and against_fp16.culprits == []


def test_bisects_deprecated_reference_keywords_build_the_same_golden() -> None:
    by_side = precguard.bisect(PLANTED, golden=Side(FINE, "cpu", "float64"))
    by_keywords = precguard.bisect(
        FINE, device="emu:fp16", prepare=plant, reference="cpu", reference_dtype="float64"
    )
    assert by_side.model_dump() == by_keywords.model_dump()
    assert by_side.reference_dtype == "float64"


# -- verify_findings (check --verify) ----------------------------------------------------------


def test_verify_findings_measures_the_planted_fault_only_when_the_side_carries_it() -> None:
    planted = verify(FLAGGED, PLANTED, golden=Side(FINE))
    (norm,) = planted.impacts
    assert norm.module == NORM and norm.share > 0.9
    fix = {r.remedy: r for r in norm.remedies}["reference-precision"]
    assert fix.verdict == "verified"
    assert (planted.device, planted.reference, planted.reference_dtype) == (
        "emu:fp16",
        "cpu",
        "float32",
    )
    clean = verify(FLAGGED, CLEAN, golden=Side(FINE))
    assert clean.output_error < planted.output_error / 50
    assert {r.remedy: r for r in clean.impacts[0].remedies}["reference-precision"].verdict == (
        "not needed"  # the clean side's output is within the floor: nothing to fix
    )


def test_verify_findings_against_a_golden_on_the_same_device_sees_no_error() -> None:
    """The golden Side's device reaches the reference run: the planted model on emu:fp16
    against itself on emu:fp16 has no output error at all."""
    same = verify(FLAGGED, PLANTED, golden=Side(FINE, "emu:fp16"))
    assert same.output_error == 0.0
    assert same.reference == "emu:fp16"


def test_verify_takes_the_actual_as_a_side_only() -> None:
    """One entry point, one way to say a side (issue 38): a target spec is refused."""
    with pytest.raises(UsageError, match=r"verify takes the actual side as a precguard\.Side"):
        verify(FLAGGED, FINE)


# -- verify an op-check sweep (op-check --verify) -----------------------------------------------


@pytest.fixture(scope="module")
def failed_sweep() -> Any:
    """op-check of the planted norm: it fails at a large mean (its squares overflow)."""
    result = precguard.op_check(side=PLANTED, module=NORM, seq_lens="6")
    assert result.exit_code == 1
    return result


def test_verify_opcheck_re_runs_the_sides_it_is_given(failed_sweep: Any) -> None:
    planted = verify(failed_sweep, PLANTED, golden=Side(FINE))
    assert planted.impacts[0].module == NORM and planted.impacts[0].share > 0.9
    assert planted.impacts[0].remedies  # verify=True: the remedies were re-run
    # the same sweep's finding on the clean model: the norm is no share of its error
    clean = verify(failed_sweep, CLEAN, golden=Side(FINE), remedies=False)
    assert clean.output_error < planted.output_error / 50
    assert clean.impacts[0].share < 0.5 and not clean.impacts[0].remedies
    # the golden's dtype is the reference's
    wide = verify(failed_sweep, PLANTED, golden=Side(FINE, "cpu", "float64"), remedies=False)
    assert wide.reference_dtype == "float64"


# -- verify a comparison (compare --target) -----------------------------------------------------


@pytest.fixture(scope="module")
def planted_comparison(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The planted model recorded on the CPU and on emu:fp16, compared: its norm diverges."""
    base = tmp_path_factory.mktemp("planted")
    golden = precguard.record_target(PLANTED.replace(device="cpu"), out=base / "g", tensors=True)
    actual = precguard.record_target(PLANTED, out=base / "a", tensors=True)
    result = precguard.compare_runs(golden, actual)
    assert result.verdict == "diverged" and result.first_divergence.module == NORM
    return result


def test_the_recorded_sides_re_run_reproduce_the_comparison_when_they_carry_the_set_up(
    planted_comparison: Any,
) -> None:
    golden, actual = comparison_sides(planted_comparison, PLANTED)
    assert (golden.device, actual.device) == ("cpu", "emu:fp16")
    measured = verify(planted_comparison, actual, golden=golden, remedies=False).impact
    assert measured is not None and measured.impacts[0].share > 0.9
    # the re-run reproduces the recorded actual side bit for bit
    assert measured.recorded_output_error == measured.output_error
    # the target alone, without the Side's set-up, is not what the actual side ran
    bare = verify(planted_comparison, Side(FINE, "emu:fp16"), remedies=False).impact
    assert bare is not None and bare.output_error < measured.output_error / 50
    assert "not the recordings'" in bare.note


# -- saying a side twice -----------------------------------------------------------------------


def _other(model: nn.Module) -> None:
    """A set-up of the golden's own (the sides copy one build: refused)."""


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (
            lambda: precguard.bisect(PLANTED, golden=Side(FINE), reference="cpu"),
            "bisect: reference given beside golden=",
        ),
        (
            lambda: precguard.bisect(PLANTED, golden=Side(FINE), reference_dtype="float64"),
            "bisect: reference_dtype given beside golden=",
        ),
        (lambda: precguard.bisect(PLANTED, golden=Side("tiny-llama")), "golden Side runs"),
        (
            lambda: precguard.bisect(PLANTED, golden=Side(FINE, prepare=_other)),
            "golden Side has a prepare of its own",
        ),
        (lambda: precguard.bisect(PLANTED, golden="cpu"), "takes a Side"),
        (lambda: verify(FLAGGED, PLANTED, golden=Side("tiny-llama")), "golden Side runs"),
        (
            lambda: ActualSide.open(PLANTED, golden=Side(FINE), reference="cpu"),
            "impact: reference given beside golden=",
        ),
        (
            lambda: ActualSide.open(PLANTED, prepare=plant),
            "impact: prepare given beside a Side",
        ),
        (
            lambda: precguard.generate_diff(actual=PLANTED, golden=Side(FINE), reference="cpu"),
            "generate_diff: reference given beside golden=",
        ),
        (lambda: precguard.generate_diff(FINE, actual=PLANTED), "target given beside actual="),
    ],
)
def test_a_side_said_twice_is_a_usage_error(call: Any, named: str) -> None:
    with pytest.raises(UsageError, match=named):
        call()


def test_verify_refuses_a_golden_of_another_target_before_re_running(
    planted_comparison: Any,
) -> None:
    """Not swallowed into the budget's note as a failed re-run would be: the caller's error."""
    with pytest.raises(UsageError, match="golden Side runs"):
        verify(planted_comparison, PLANTED, golden=Side("tiny-llama"))


# -- the CLI builds the Sides ------------------------------------------------------------------


@pytest.mark.slow
def test_bisects_reference_options_reach_the_golden_run(tmp_path: Path) -> None:
    out = tmp_path / "bisect.json"
    run = precguard_cli(
        "bisect", "-t", FINE, "-d", "emu:fp16", "--reference-dtype", "float64", "--json", str(out)
    )
    assert run.returncode == 0, run.stderr
    result = json.loads(out.read_text())
    assert (result["reference"], result["reference_dtype"]) == ("cpu", "float64")
    bad = precguard_cli("bisect", "-t", FINE, "-d", "emu:fp16", "--reference-dtype", "float9")
    assert bad.returncode == 2 and "float9" in bad.stderr and "Traceback" not in bad.stderr
