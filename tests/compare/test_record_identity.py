"""One record identity: a record result, the first divergence and a suspect name a record alike.

A module called twice per step (a shared block, a weight-tied layer) is the
case where the identity matters: the fault is in its *second* call, and the
report must say so in every place it names the record.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

import precguard
from precguard.compare import FirstDivergence, RecordIdentity, RecordResult, Suspect


class SharedBlockModel(nn.Module):
    """A linear block applied twice, like a weight-shared recurrent layer."""

    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(16, 16)
        self.shared = nn.Linear(16, 16)
        self.out = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.shared(self.inp(x)))
        return self.out(self.shared(h))


def _record(path: Path, *, fault_on_call: int | None) -> Path:
    torch.manual_seed(0)
    model = SharedBlockModel().eval()
    calls = {"n": 0}

    def scale_one_call(_module: nn.Module, _args: object, output: torch.Tensor) -> torch.Tensor:
        call, calls["n"] = calls["n"], calls["n"] + 1
        return output * 1.01 if call == fault_on_call else output

    handle = model.shared.register_forward_hook(scale_one_call)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    try:
        with torch.no_grad(), precguard.monitor(model, path, tensors=True):
            model(x)
    finally:
        handle.remove()
    return path


def test_the_second_call_of_a_shared_block_is_named_with_its_call(tmp_path: Path) -> None:
    golden = _record(tmp_path / "golden", fault_on_call=None)
    actual = _record(tmp_path / "actual", fault_on_call=1)

    result = precguard.compare_runs(golden, actual)

    first = result.first_divergence
    assert first is not None
    assert (first.module, first.call, first.phase, first.role) == ("shared", 1, "forward", "output")
    assert first.key == "shared.1.forward.output.0"
    failing = next(r for r in result.records if r.key == first.key)
    assert failing.identity() == first.identity()
    assert failing.local is True  # the decision about that very record
    passing = next(r for r in result.records if r.key == "shared.0.forward.output.0")
    assert passing.status == "pass" and passing.call == 0


def test_identity_fields_stay_flat_in_the_json(tmp_path: Path) -> None:
    golden = _record(tmp_path / "golden", fault_on_call=None)
    actual = _record(tmp_path / "actual", fault_on_call=1)

    data = json.loads(precguard.compare_runs(golden, actual).model_dump_json())

    first = data["first_divergence"]
    for name in RecordIdentity.model_fields:
        assert name in first, name
    assert first["call"] == 1 and first["index"] == 0
    assert all("call" in r and "index" in r for r in data["records"])


def test_all_three_report_models_are_record_identities() -> None:
    for model in (RecordResult, FirstDivergence, Suspect):
        assert issubclass(model, RecordIdentity)
        assert set(RecordIdentity.model_fields) <= set(model.model_fields)
