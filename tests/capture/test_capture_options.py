"""Capture takes its options object; the active recording belongs to its context.

``monitor``, ``record``, ``precision_monitor`` and ``record_target`` all take
a ``CaptureOptions`` and/or its fields as keyword arguments, validated by the
same model. A recording opened with ``record()`` is active in the thread (or
asyncio task) that opened it, not in every thread of the process.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from torch import nn

import precguard
from precguard import CaptureOptions


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.Tanh(), nn.Linear(4, 2))


def _saved(path: Path) -> set[str]:
    return {r.module for r in precguard.load_run(path).records() if r.tensor is not None}


def test_monitor_takes_an_options_object_and_keywords_override_it(tmp_path: Path) -> None:
    model, x = _model(), torch.ones(3, 4)
    options = CaptureOptions(tensors=["0"], backward=False)

    with torch.no_grad(), precguard.monitor(model, tmp_path / "a", options):
        model(x)
    with torch.no_grad(), precguard.monitor(model, tmp_path / "b", options, tensors=["2"]):
        model(x)

    assert _saved(tmp_path / "a") == {"0"}
    assert _saved(tmp_path / "b") == {"2"}
    manifest = precguard.load_run(tmp_path / "b").manifest
    assert manifest.options["tensors"] == ["2"] and manifest.options["backward"] is False


@pytest.mark.parametrize("api", ["monitor", "record", "precision_monitor"])
def test_a_misspelt_option_is_an_error_naming_it(tmp_path: Path, api: str) -> None:
    with pytest.raises(ValidationError, match="tensor"):
        if api == "monitor":
            precguard.monitor(_model(), tmp_path / "run", tensor=True)
        elif api == "record":
            with precguard.recording(tmp_path / "run", tensor=True):
                pass
        else:
            precguard.precision_monitor(tensor=True)
    assert not (tmp_path / "run").exists()


def test_record_target_takes_options_and_train_fills_what_is_unset(tmp_path: Path) -> None:
    inference = precguard.record_target(
        "tiny-llama", out=tmp_path / "inf", options=CaptureOptions(params="never")
    )
    training = precguard.record_target(
        "tiny-llama", out=tmp_path / "train", train=True, tensors=["model.norm"]
    )

    inf = precguard.load_run(inference)
    assert inf.manifest.options["params"] == "never" and inf.manifest.options["backward"] is False
    assert not any(r.role == "param" for r in inf.records())
    train = precguard.load_run(training)
    assert train.manifest.options["backward"] is True
    assert train.manifest.options["params"] == "every_step"
    assert _saved(training) == {"model.norm"}


def test_precision_monitor_options_object_sets_only_what_it_names(tmp_path: Path) -> None:
    @precguard.precision_monitor(options=CaptureOptions(tensors=False))
    def scaled(x: torch.Tensor) -> torch.Tensor:
        return x * 2

    # the recording saves every tensor; the decorator explicitly said no
    with precguard.recording(tmp_path / "run", tensors=True):
        scaled(torch.ones(3))

    records = list(precguard.load_run(tmp_path / "run").records())
    assert records and all(r.tensor is None for r in records)


def test_each_thread_records_into_the_recording_it_opened(tmp_path: Path) -> None:
    @precguard.precision_monitor(name="work")
    def work(x: torch.Tensor) -> torch.Tensor:
        return x + 1

    barrier = threading.Barrier(2)
    errors: list[BaseException] = []

    def session(name: str, calls: int) -> None:
        try:
            with precguard.recording(tmp_path / name, auto_step=False):
                barrier.wait(timeout=30)  # both recordings open at once
                for _ in range(calls):
                    work(torch.ones(2))
                barrier.wait(timeout=30)
        except BaseException as exc:  # reported below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=session, args=(n, c)) for n, c in (("a", 1), ("b", 3))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)

    assert not errors
    calls = {
        name: {r.call for r in precguard.load_run(tmp_path / name).records()} for name in ("a", "b")
    }
    assert calls == {"a": {0}, "b": {0, 1, 2}}


@precguard.precision_monitor
class Scale(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


def test_backward_run_in_another_thread_still_records_parameter_gradients(tmp_path):
    """Accelerator backward runs on autograd's device threads, outside the recording's
    context; the gradients of a decorated module still belong to its recording."""
    torch.manual_seed(0)
    model = Scale()
    with precguard.recording(tmp_path / "run"):
        loss = model(torch.ones(2, 4)).sum()
        worker = threading.Thread(target=loss.backward)
        worker.start()
        worker.join(timeout=60)

    grads = {r.key for r in precguard.load_run(tmp_path / "run").records() if r.role == "grad"}
    assert {"Scale#0.lin.0.backward.grad.0", "Scale#0.lin.0.backward.grad.1"} <= grads
