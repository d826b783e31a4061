"""compare on fp8 runs: a correct fp8 run of tiny-llama matches; a planted fp8 fault is named.

The fast subset of the corpus's fp8 pairs (``benchmarks/calibration.py --only fp8``
runs them all and prints the table in docs/fp8.md).
"""

from __future__ import annotations

import pytest

from tests.compare.calibration_corpus import CORPUS, Pair, Runner

pytestmark = pytest.mark.slow

_FP8 = [p for p in CORPUS if p.fast and "fp8" in p.name]


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    return Runner(tmp_path_factory.mktemp("calibration-fp8"))


def test_the_fp8_corpus_has_six_clean_pairs_and_every_fault_kind() -> None:
    fp8 = [p for p in CORPUS if "fp8" in p.name]
    assert len([p for p in fp8 if p.expect is None]) >= 6
    kinds = {p.kind.rsplit(" x", 1)[0] for p in fp8 if p.expect is not None}
    assert kinds == {"fp8 stale amax", "fp8 shared block scale", "fp8 saturated outlier channel"}


@pytest.mark.parametrize("pair", _FP8, ids=lambda p: p.name)
def test_fp8_pair(pair: Pair, runner: Runner) -> None:
    outcome = runner.run(pair)
    assert outcome is not None
    if pair.expect is None:
        assert outcome.verdict == "match", (outcome.named, outcome.reason)
    else:
        assert outcome.named in pair.expect and outcome.local is True, outcome.reason
        assert "float8_e4m3fn precision" in outcome.reason


def test_a_block_scale_read_for_the_wrong_block_is_named_by_the_fp8_checklist(
    runner: Runner,
) -> None:
    # compare does not name it (a clip of one tile stays under tenfold the fp8 error
    # its inputs inherit, docs/fp8.md); fp8.saturation reads the GEMM's operand and does
    fault = next(p for p in CORPUS if p.kind == "fp8 shared block scale")
    outcome = runner.run(fault)
    assert outcome is not None and outcome.ok
    assert outcome.tool == "check fp8.saturation"
    assert outcome.named == "model.layers.1.mlp.down_proj"
    # the same block-scaled model without the fault passes the checklist and compare
    clean = next(p for p in CORPUS if p.name == "tiny-llama-sink fp8-e4m3-block vs fp32")
    assert clean.checklist == "fp8"
    outcome = runner.run(clean)
    assert outcome is not None and outcome.ok and not outcome.checklist_failed
