"""The checklist takes a ``precguard.Side``: the device under test said one way.

``precguard.check("quick", Side("tiny-llama", "emu:bf16"))`` runs the same checks as
the older ``check("quick", "tiny-llama", device="emu:bf16")`` and finds the same
things; a keyword beside the Side is a usage error, and the Side's ``prepare``
reaches the models the checks run.
"""

from __future__ import annotations

import pytest
import torch

import precguard
from precguard import Side

#: two quick checks that build the model and run it on both devices (seconds on tiny-llama)
ONLY = ["norm.extreme_inputs", "loss.logits_range"]


def _found(diagnosis: precguard.Diagnosis) -> list[tuple]:
    return [(f.id, f.status, f.summary, f.evidence) for f in diagnosis.findings]


def test_a_side_finds_what_the_keywords_find():
    by_keywords = precguard.check("quick", "tiny-llama", device="emu:bf16", only=ONLY)
    by_side = precguard.check("quick", Side("tiny-llama", "emu:bf16"), only=ONLY)
    assert [f.id for f in by_side.findings] == ONLY  # both checks ran
    assert _found(by_side) == _found(by_keywords)
    assert (by_side.device, by_side.dtype, by_side.verdict) == ("emu:bf16", "float32", "pass")
    with_reference = precguard.check(
        "quick", Side("tiny-llama", "emu:bf16"), reference=Side("tiny-llama"), only=ONLY
    )
    assert _found(with_reference) == _found(by_keywords)


def test_the_sides_prepare_reaches_the_models_the_checks_run():
    def poison_the_head(model: torch.nn.Module) -> None:
        with torch.no_grad():
            model.lm_head.weight[0, 0] = float("nan")

    planted = precguard.check(
        "quick",
        Side("tiny-llama", "emu:bf16", prepare=poison_the_head),
        only=["loss.logits_range"],
    )
    assert planted.findings[0].status == "fail"
    assert "NaN/Inf" in planted.findings[0].summary


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: precguard.check("quick", Side("tiny-llama"), device="emu:bf16"), "device"),
        (lambda: precguard.check("quick", Side("tiny-llama"), dtype="float16"), "dtype"),
        (
            lambda: precguard.check(
                "quick", Side("tiny-llama"), reference=Side("parallel-decoder")
            ),
            "compare one target",
        ),
        (
            lambda: precguard.check(
                "quick", Side("tiny-llama"), reference=Side("tiny-llama", dtype="bfloat16")
            ),
            "float32",
        ),
    ],
)
def test_a_keyword_or_reference_that_conflicts_with_the_side_is_a_usage_error(call, named):
    with pytest.raises(precguard.UsageError, match=named):
        call()


def test_the_cli_builds_the_side_and_finds_what_the_api_finds(run_check):
    run = run_check("--checklist", "quick", "--device", "emu:bf16", *(f"--only={c}" for c in ONLY))
    assert run.code == 0, run.err
    api = precguard.check("quick", Side("tiny-llama", "emu:bf16"), only=ONLY)
    cli = [(f["id"], f["status"], f["summary"]) for f in run.diagnosis["findings"]]
    assert cli == [(f.id, f.status, f.summary) for f in api.findings]
