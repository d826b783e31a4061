"""``precguard ranks`` on hand-written two- and four-rank recordings (fast, no torchrun)."""

from __future__ import annotations

import pytest
import torch

from precguard import UsageError, check_replicas
from tests.distributed.synthetic import collective, write_ranks

W = torch.randn(16, 8, generator=torch.Generator().manual_seed(0))


def dp_rank(rank: int, weight: torch.Tensor = W) -> list:
    """A data-parallel rank: its own activation, the shared weight."""
    act = torch.randn(4, 16, generator=torch.Generator().manual_seed(10 + rank))
    return [("fc", "param", weight, {}), ("fc", "output", act, {})]


def test_replicas_with_equal_weights_agree(tmp_path):
    run = write_ranks(tmp_path / "r", {0: dp_rank(0), 1: dp_rank(1)})
    report = check_replicas(run)
    assert report.verdict == "agree" and report.compared == 2
    assert report.first_disagreement is None and report.first_nonfinite is None


def test_a_weight_one_ulp_off_on_one_rank_is_the_first_disagreement(tmp_path):
    drifted = W.clone()
    drifted[3, 5] = torch.nextafter(drifted[3, 5], torch.tensor(1e9))
    ranks = {0: dp_rank(0), 1: dp_rank(1), 2: dp_rank(2, drifted), 3: dp_rank(3)}
    report = check_replicas(write_ranks(tmp_path / "r", ranks, save=True))
    d = report.first_disagreement
    assert report.verdict == "disagree"
    assert d.key == "fc.0.forward.param.0" and d.differing_ranks == [2] and d.level == "tensor"


def test_statistics_alone_name_the_differing_rank(tmp_path):
    ranks = {0: dp_rank(0), 1: dp_rank(1, W * 1.001), 2: dp_rank(2)}
    d = check_replicas(write_ranks(tmp_path / "r", ranks)).first_disagreement
    assert d.level == "stats" and d.differing_ranks == [1]


def test_groups_limit_who_must_agree(tmp_path):
    # tensor parallel x2, data parallel x2: ranks 0,2 hold one shard, 1,3 the other
    shard = {0: W[:8], 1: W[8:], 2: W[:8], 3: W[8:]}
    ranks = {r: dp_rank(r, shard[r]) for r in range(4)}
    run = write_ranks(tmp_path / "r", ranks)
    assert check_replicas(run).verdict == "disagree"  # all four taken as replicas: wrong
    assert check_replicas(run, groups=[[0, 2], [1, 3]]).verdict == "agree"


def test_nan_from_one_rank_spreads_through_the_all_reduce(tmp_path):
    x = torch.ones(4)
    bad = x.clone()
    bad[1] = float("nan")
    summed = torch.full((4,), float("nan"))
    ranks = {
        r: [("dist.all_reduce", "input", bad if r == 1 else x, collective("all_reduce", [0, 1])),
            ("dist.all_reduce", "output", summed, collective("all_reduce", [0, 1]))]
        for r in (0, 1)
    }  # fmt: skip
    report = check_replicas(write_ranks(tmp_path / "r", ranks))
    assert report.first_nonfinite.rank == 1
    assert report.first_nonfinite.key == "dist.all_reduce.0.forward.input.0"
    assert report.spread.module == "dist.all_reduce"
    assert report.spread.from_ranks == [1] and report.spread.to_ranks == [0, 1]


def allreduce_ranks(inputs: list[torch.Tensor], output: torch.Tensor) -> dict:
    group = list(range(len(inputs)))
    return {
        r: [("dist.all_reduce", "input", inputs[r], collective("all_reduce", group)),
            ("dist.all_reduce", "output", output, collective("all_reduce", group))]
        for r in group
    }  # fmt: skip


def test_an_all_reduce_in_some_order_is_order_noise(tmp_path):
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(256, generator=gen) * 10**k for k in range(4)]
    output = ((inputs[3] + inputs[1]) + inputs[0]) + inputs[2]  # a ring's order, in float32
    report = check_replicas(write_ranks(tmp_path / "r", allreduce_ranks(inputs, output), save=True))
    (order,) = report.order
    assert order.verdict == "order_noise" and order.bound_ratio <= 1.0
    assert report.verdict == "agree"


def test_an_all_reduce_that_dropped_a_rank_is_beyond_order_noise(tmp_path):
    gen = torch.Generator().manual_seed(1)
    inputs = [torch.randn(256, generator=gen) for _ in range(4)]
    output = inputs[0] + inputs[1] + inputs[2]  # rank 3's contribution lost
    report = check_replicas(write_ranks(tmp_path / "r", allreduce_ranks(inputs, output), save=True))
    (order,) = report.order
    assert order.verdict == "beyond_order_noise" and order.bound_ratio > 1e3
    assert report.verdict == "disagree"


def test_nothing_replicas_share_is_inconclusive_not_a_pass(tmp_path):
    act = {r: [("fc", "output", torch.randn(4), {})] for r in (0, 1)}
    report = check_replicas(write_ranks(tmp_path / "r", act))
    assert report.verdict == "inconclusive" and report.compared == 0


def test_one_rank_is_refused(tmp_path):
    with pytest.raises(UsageError, match="two or more ranks"):
        check_replicas(write_ranks(tmp_path / "r", {0: dp_rank(0)}))


@pytest.mark.parametrize(
    ("ranks", "code", "says"),
    [
        ({0: dp_rank(0), 1: dp_rank(1)}, 0, "REPLICAS AGREE"),
        ({0: dp_rank(0), 1: dp_rank(1, W * 2)}, 1, "rank(s) [1] differ"),
        ({r: [("fc", "output", torch.randn(4), {})] for r in (0, 1)}, 3, "NOTHING COMPARED"),
    ],
)
def test_the_ranks_command_exit_codes(tmp_path, capsys, ranks, code, says):
    from precguard.cli import main

    run = write_ranks(tmp_path / "r", ranks)
    with pytest.raises(SystemExit) as info:
        main(["ranks", str(run)])
    out = " ".join(capsys.readouterr().out.split())
    assert (info.value.code or 0) == code and says in out


def test_the_ranks_command_refuses_one_rank_in_one_line(tmp_path, capsys):
    from precguard.cli import main

    with pytest.raises(SystemExit) as info:
        main(["ranks", str(write_ranks(tmp_path / "r", {0: dp_rank(0)}))])
    err = capsys.readouterr().err
    assert info.value.code == 2 and err.count("\n") == 1 and "two or more ranks" in err
