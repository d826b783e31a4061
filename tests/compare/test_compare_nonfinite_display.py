"""NaN/Inf are never shown as zero error (issue 29).

The user story: the golden is the correct parallel decoder on the CPU, the run
under test computes its attention scores in fp16 and overflows (the sink's raw
score is ~1e5). Every record after it holds NaN where golden has numbers; the
error metrics of the elements that are finite on both sides are 0, and the
panel used to read "rel_l2 0 cosine 1.000000 max_abs 0", "measured 0",
"amplification 0.767x".
"""

from __future__ import annotations

import io

import pytest
from rich.console import Console

import precguard
from precguard.compare.render import metric_line, render
from tests.compare.parallel_small import small_target


@pytest.fixture(scope="module")
def overflow(tmp_path_factory):
    root = tmp_path_factory.mktemp("nonfinite")
    golden = precguard.record_target(small_target(), device="cpu", out=root / "g", tensors=True)
    actual = precguard.record_target(
        small_target("qk_fp16"), device="emu:bf16", out=root / "a", tensors=True
    )
    return precguard.compare_runs(golden, actual)


def _text(result) -> str:
    buf = io.StringIO()
    render(result, Console(file=buf, width=400))
    return buf.getvalue()


def test_the_overflow_is_named_and_its_nan_count_is_the_error(overflow):
    fd = overflow.first_divergence
    assert overflow.verdict == "diverged" and fd is not None
    assert fd.module == "transformer.h.0.attn"
    assert fd.metrics.nan_mismatch > 0
    line = metric_line(fd.metrics)
    assert line.startswith(f"non-finite: {fd.metrics.nan_mismatch} NaN")
    assert "over the elements finite on both sides" in line
    # the record's own note says which elements the norms were measured on
    assert "finite on both sides" in (fd.metrics.note or "")


def test_the_panel_never_reads_as_zero_error(overflow):
    text = _text(overflow)
    panel = text.split("first divergence", 1)[1].split("why", 1)[0]
    assert "measured non-finite (" in panel
    assert "measured 0" not in panel
    assert "amplification" not in panel  # a ratio of finite parts says nothing here
    # the top table shows the mismatch, not an error of 0 with cosine 1
    for row in text.splitlines():
        if "nonfinite" in row and "transformer.h.0.attn " in row:
            assert "non-finite" in row and "1.000000" not in row


def test_a_finite_record_is_shown_as_before(overflow):
    clean = next(r for r in overflow.records if r.status == "pass" and r.metrics.level == "full")
    assert metric_line(clean.metrics).startswith("rel_l2 ")
