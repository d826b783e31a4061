"""precguard's own precision regression tests: the built-in tiny-llama target, guarded.

The goldens live in ``tests/guard/goldens/test_regression_tiny_llama/`` (one per
device, statistics only, ~90 kB each), written with ``pytest
tests/guard/test_regression_tiny_llama.py --precguard-update-golden``. A change
to capture, to the emulator or to torch that moves tiny-llama's numbers fails
here, naming the module that moved; a refresh is reviewed like any other diff
(docs/guard.md).

The ``emu:bf16`` run is also checked against the *CPU fp32* golden, the port's
workflow: each record judged at bf16 precision (the less precise side).
"""

from __future__ import annotations

from pathlib import Path

import pytest

import precguard
from precguard import seed_everything
from precguard.plugins import get_backend
from precguard.testing import assert_matches_golden

GOLDENS = Path(__file__).with_name("goldens") / "test_regression_tiny_llama"


def _tiny_llama() -> tuple[object, object]:
    target = precguard.load_target("tiny-llama")
    backend = get_backend("cpu")
    assert backend is not None
    seed_everything(backend, target.seed)  # the init every `precguard record` starts from
    return target.model().eval(), target.batch(0)


@pytest.mark.parametrize("device", ["cpu", "emu:bf16"])
def test_tiny_llama_matches_its_golden(device: str, precguard_golden: Path) -> None:
    model, batch = _tiny_llama()
    check = assert_matches_golden(model, batch, precguard_golden, device=device)
    if check.action == "compared":  # not while the golden is being written
        assert check.worst is not None and check.worst.margin < 1


def test_an_emu_bf16_run_matches_the_cpu_fp32_golden_at_bf16_precision() -> None:
    model, batch = _tiny_llama()
    golden = GOLDENS / "test_tiny_llama_matches_its_golden-cpu"
    check = assert_matches_golden(model, batch, golden, device="emu:bf16", update=False)
    assert check.comparison is not None
    assert check.comparison.devices == ["cpu", "emu:bf16"]
    worst = check.worst
    assert worst is not None and worst.dtype == "bfloat16"
    assert 0 < worst.margin < 1  # bf16 rounding shows, within what bf16 explains
