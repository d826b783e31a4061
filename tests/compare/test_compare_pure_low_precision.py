"""Pure low-precision training: weights and optimizer state in bf16/fp16 (issue 29).

The user story: a model trained a few steps with AdamW (eps 1e-8) entirely in
low precision, against its fp32 golden. In bf16 a correct run matches, although
AdamW's small steps round away on weights near 1 and the next step's gradients
differ systematically. In fp16 the optimizer state really turns the parameters
NaN/Inf (eps 1e-8 is 0 in fp16): the verdict says so first, with step,
parameter and counts, never as a small error.
"""

from __future__ import annotations

import re

import pytest

import precguard
from tests.compare.parallel_small import small_target

# the sink's massive value at 1e4: finite in fp16, so the forward of step 0 is sound
SINK = {"sink_value": 1.0e4}


@pytest.fixture(scope="module")
def golden(tmp_path_factory):
    out = tmp_path_factory.mktemp("pure") / "g"
    return precguard.record_target(
        small_target(**SINK), device="cpu", out=out, train=True, steps=2, tensors=True
    )


@pytest.mark.parametrize("tensors", [True, False], ids=["full", "stats-only"])
def test_a_parameter_that_turned_nan_in_fp16_is_named_with_step_and_counts(
    golden, tmp_path, tensors
):
    actual = precguard.record_target(
        small_target(**SINK),
        device="cpu",
        dtype="float16",
        out=tmp_path / "a",
        train=True,
        steps=2,
        tensors=tensors,
    )
    result = precguard.compare_runs(golden, actual)
    fd = result.first_divergence
    assert result.verdict == "diverged" and fd is not None
    assert fd.role == "param" and fd.step == 1
    nan, inf = fd.metrics.nan_mismatch, fd.metrics.inf_mismatch
    assert nan + inf > 0
    assert f"became non-finite by step 1: {nan} NaN and {inf} Inf" in fd.reason
    assert "eps of 1e-8 rounds to 0" in fd.reason
    # never the error of the finite elements
    assert not re.search(r"\(error [0-9.e-]+", fd.reason)


@pytest.mark.parametrize("tensors", [True, False], ids=["full", "stats-only"])
def test_a_correct_run_in_pure_bf16_matches(golden, tmp_path, tensors):
    actual = precguard.record_target(
        small_target(**SINK),
        device="cpu",
        dtype="bfloat16",
        out=tmp_path / "a",
        train=True,
        steps=2,
        tensors=tensors,
    )
    result = precguard.compare_runs(golden, actual)
    failed = [(r.key, r.step) for r in result.records if r.status != "pass"]
    assert result.verdict == "match", failed
