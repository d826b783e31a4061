"""Determinism by hashes: equal runs hash alike; one nondeterministic op is named."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from precguard import compare_bitwise
from precguard.capture.hashing import HashBuffer, tensor_hash
from precguard.cli import main
from tests.watch.conftest import batch


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return info.value.code or 0, out, err


# -- the hash itself ------------------------------------------------------------------


def test_the_hash_sees_one_ulp_and_the_sign_of_zero() -> None:
    x = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    y = x.clone()
    y[2, 3] = torch.nextafter(y[2, 3], torch.tensor(float("inf")))
    assert tensor_hash(x) == tensor_hash(x.clone())
    assert tensor_hash(x) != tensor_hash(y)
    assert tensor_hash(torch.tensor([0.0])) != tensor_hash(torch.tensor([-0.0]))


def test_the_hash_is_of_values_in_logical_order_not_of_memory() -> None:
    x = torch.randn(6, 7, generator=torch.Generator().manual_seed(1))
    assert tensor_hash(x.t()) == tensor_hash(x.t().contiguous())
    assert tensor_hash(x.t()) != tensor_hash(x)  # same bytes, another order
    # two elements swapped: a different ordered hash, the same order-independent one
    swapped = x.flatten().clone()
    swapped[[0, 1]] = swapped[[1, 0]]
    assert tensor_hash(swapped) != tensor_hash(x.flatten())
    assert tensor_hash(swapped, ordered=False) == tensor_hash(x.flatten(), ordered=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64, torch.int64])
def test_every_dtype_hashes_and_a_changed_element_changes_it(dtype: torch.dtype) -> None:
    x = torch.arange(40).reshape(5, 8).to(dtype)
    y = x.clone()
    y[4, 7] += 1
    assert tensor_hash(x) != tensor_hash(y)
    buf = HashBuffer()
    slots = [buf.add(x), buf.add(y)]
    assert buf.materialize() == [tensor_hash(x), tensor_hash(y)]
    assert slots == [0, 1] and len(buf) == 0


# -- two runs -------------------------------------------------------------------------


class Pooled(nn.Module):
    """Sums rows into bins with index_add_; ``order`` is the order the rows are added in."""

    def __init__(self, order: torch.Tensor) -> None:
        super().__init__()
        self.order = order

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        bins = torch.arange(x.shape[0]) % 2  # duplicate indices: a sum per bin
        out = torch.zeros(2, x.shape[1], dtype=x.dtype)
        return out.index_add(0, bins[self.order], x[self.order])


class Net(nn.Module):
    def __init__(self, order: torch.Tensor) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 32)
        self.pool = Pooled(order)
        self.out = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(torch.tanh(self.pool(self.inp(x))))


def _train(out: Path, order: torch.Tensor, steps: int = 3) -> Path:
    torch.manual_seed(0)
    model = Net(order)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with precguard.watch(model, opt, every=1, out=out, hashes=True) as w:
        for step in range(steps):
            x, y = batch(step)
            loss = (model(x).sum(0) - y.sum(0)).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss)
    assert w.recording_path is not None
    return w.recording_path


def test_two_identical_runs_have_equal_hashes(tmp_path: Path, capsys) -> None:
    order = torch.arange(8)
    a, b = _train(tmp_path / "a", order), _train(tmp_path / "b", order)
    result = compare_bitwise(a, b)
    assert result.verdict == "identical"
    assert result.compared == result.equal > 50  # every record of 3 steps
    assert run_cli(["bitwise", str(a), str(b)], capsys)[0] == 0


def test_one_op_summing_in_another_order_is_named_as_the_first_difference(
    tmp_path: Path, capsys
) -> None:
    forward, reverse = torch.arange(8), torch.arange(8).flip(0)
    # the premise: the two orders round differently
    x = nn.Linear(16, 32)(batch(0)[0])
    assert not torch.equal(Pooled(forward)(x), Pooled(reverse)(x))

    a, b = _train(tmp_path / "a", forward), _train(tmp_path / "b", reverse)
    result = compare_bitwise(a, b)

    assert result.verdict == "differs"
    first = result.first_difference
    assert first is not None
    assert (first.key, first.step, first.reason) == ("pool.0.forward.output.0", 0, "hash")
    code, out, _err = run_cli(["bitwise", str(a), str(b)], capsys)
    assert code == 1
    assert "first difference: pool.0.forward.output.0" in out
    # the old spelling still runs it, and says where it moved
    code, out, err = run_cli(["compare", "--bitwise", str(a), str(b)], capsys)
    assert code == 1 and "first difference: pool.0.forward.output.0" in out
    assert "compare --bitwise is now `precguard bitwise`" in err


def test_recordings_without_hashes_are_inconclusive_not_identical(tmp_path: Path, capsys) -> None:
    torch.manual_seed(0)
    model = nn.Linear(4, 4)
    for name in ("a", "b"):
        with precguard.monitor(model, tmp_path / name):
            model(torch.ones(2, 4))
    result = compare_bitwise(tmp_path / "a", tmp_path / "b")
    assert result.verdict == "inconclusive" and result.compared == 0
    code, out, _err = run_cli(["bitwise", str(tmp_path / "a"), str(tmp_path / "b")], capsys)
    assert code == 3
    assert "hashes=True" in out


def test_monitor_records_hashes_when_asked(tmp_path: Path) -> None:
    model = nn.Linear(4, 3)
    x = torch.randn(2, 4)
    with precguard.monitor(model, tmp_path / "r", hashes=True):
        y = model(x)
    records = {r.key: r for r in precguard.load_run(tmp_path / "r").records()}
    assert records["root.0.forward.output.0"].hash == tensor_hash(y)
    assert records["root.0.forward.input.0"].hash == tensor_hash(x)


def test_bitwise_refuses_options_it_would_ignore(tmp_path: Path, capsys) -> None:
    code, _out, err = run_cli(
        ["compare", "--bitwise", str(tmp_path), str(tmp_path), "--html", str(tmp_path / "x")],
        capsys,
    )
    assert code == 2
    assert "compares hashes only" in err and "--html" in err
    assert "`precguard bitwise`" in err
