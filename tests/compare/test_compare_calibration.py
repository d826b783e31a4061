"""The calibration corpus's fast subset: correct low-precision runs match, faults are named.

What the math guarantees: a correct model in bf16, fp16 or another fp32 reduction
order, forward and three AdamW steps, makes no error its precision does not explain
(no false alarm); a fault of 3 % in bf16 and of 0.1 % in fp32 (far above each noise
floor) is named where it was planted. The whole corpus is ``benchmarks/calibration.py``.
"""

from __future__ import annotations

import pytest

from tests.compare.calibration_corpus import CORPUS, Pair, Runner

pytestmark = pytest.mark.slow

_CLEAN = [p for p in CORPUS if p.fast and p.expect is None and "minilm" not in p.model]
_FAULTS = [
    p
    for p in CORPUS
    if p.fast
    and p.expect is not None
    and p.kind in ("projection", "rotary", "attention")
    and "bf16" in p.name
]


@pytest.fixture(scope="module")
def runner(tmp_path_factory: pytest.TempPathFactory) -> Runner:
    return Runner(tmp_path_factory.mktemp("calibration"))


@pytest.mark.parametrize("pair", _CLEAN, ids=lambda p: p.name)
def test_a_correct_run_is_no_false_alarm(pair: Pair, runner: Runner) -> None:
    outcome = runner.run(pair)
    assert outcome is not None
    assert outcome.verdict == "match", (outcome.named, outcome.reason)


@pytest.mark.parametrize("pair", _FAULTS, ids=lambda p: p.name)
def test_a_fault_above_the_noise_floor_is_named(pair: Pair, runner: Runner) -> None:
    outcome = runner.run(pair)
    assert outcome is not None and pair.expect is not None
    assert outcome.verdict == "diverged"
    assert outcome.named in pair.expect and outcome.local is True, outcome.reason


def test_the_corpus_is_large_enough() -> None:
    clean = [p for p in CORPUS if p.expect is None]
    faults = [p for p in CORPUS if p.expect is not None]
    assert len(clean) >= 30
    assert {p.kind for p in faults} >= {"projection", "norm", "rotary", "attention", "loss"}
    assert {p.magnitude for p in faults} >= {0.001, 0.03}
    assert any(p.actual.train for p in faults) and any(p.actual.train for p in clean)
