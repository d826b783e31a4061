"""A wrong input to a collective is named on the rank that produced it, not at the collective.

Two ranks of a row-parallel module: each computes a partial sum and all-reduces it.
On rank 1 the partial sum is 1 % off (a fault inside the module, before the
collective); the all-reduce then hands every rank the wrong total.
"""

from __future__ import annotations

from pathlib import Path

import torch

import precguard
from tests.distributed.synthetic import collective, write_ranks

GROUP = collective("all_reduce", [0, 1])


def _tp_run(path: Path, fault: float = 0.0) -> Path:
    gen = torch.Generator().manual_seed(0)
    x = [torch.randn(4, 16, generator=gen) for _ in range(2)]
    w = [torch.randn(8, 16, generator=gen) for _ in range(2)]
    partial = [x[r] @ w[r].T for r in range(2)]
    partial[1] = partial[1] * (1 + fault)
    total = partial[0] + partial[1]
    per_rank = {
        r: [
            ("row", "input", x[r], {}),
            ("row", "param", w[r], {}),
            ("dist.all_reduce", "input", partial[r], GROUP),
            ("dist.all_reduce", "output", total, GROUP),
            ("row", "output", total.clone(), {}),
        ]
        for r in range(2)
    }
    return write_ranks(path, per_rank, save=True)


def test_the_module_and_rank_that_fed_the_collective_a_wrong_input_are_named(
    tmp_path: Path,
) -> None:
    golden = _tp_run(tmp_path / "golden")
    actual = _tp_run(tmp_path / "actual", fault=0.01)

    result = precguard.compare_runs(golden, actual)

    fd = result.first_divergence
    assert result.verdict == "diverged" and fd is not None
    assert (fd.module, fd.rank, fd.local) == ("row", 1, True), fd.reason
    # the why says so, written once when rank 1's step was decided
    assert "on rank 1 it fed a collective a wrong input" in fd.reason, fd.reason
    assert not any(s.module.startswith("dist.") for s in result.suspects)


def test_a_correct_tensor_parallel_step_matches(tmp_path: Path) -> None:
    result = precguard.compare_runs(_tp_run(tmp_path / "g"), _tp_run(tmp_path / "a"))
    assert result.verdict == "match"
