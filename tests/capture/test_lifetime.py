"""Monitoring never keeps a model alive: once the user drops it, it is freed.

The hooks precguard puts on a model (module hooks, parameter
post-accumulate-grad hooks, which autograd's C++ side holds) point at the
monitor; the monitor must not point back at the model, or the model, its
weights and its activations' graph would live as long as the monitor — and,
through the C++-held hooks, beyond any garbage collection.
"""

from __future__ import annotations

import gc
import weakref

import torch
from torch import nn

import precguard
from tests.capture.models import Stack


def train_step(model: nn.Module) -> None:
    torch.manual_seed(0)
    model(torch.randn(4, 8)).sum().backward()


def freed(ref: weakref.ref[nn.Module]) -> bool:
    gc.collect()
    return ref() is None


def test_model_is_freed_while_the_user_keeps_the_finished_handle(tmp_path):
    model = Stack()
    with precguard.monitor(model, out=tmp_path / "run") as handle:
        train_step(model)
    ref = weakref.ref(model)
    del model
    assert freed(ref)
    assert handle.path is not None  # the handle itself stays usable
    assert precguard.load_run(handle.path).manifest.complete


def test_model_is_freed_when_monitoring_was_never_removed():
    # watch-only monitor, parameter-gradient hooks fired, no remove(): the hooks
    # die with the model instead of keeping it alive through a cycle
    model = Stack()
    handle = precguard.monitor(model)
    train_step(model)
    ref = weakref.ref(model)
    del model, handle
    assert freed(ref)


def test_model_is_freed_while_the_monitor_lives_on():
    model = Stack()
    handle = precguard.monitor(model)
    train_step(model)
    ref = weakref.ref(model)
    del model
    assert freed(ref)
    handle.remove()  # removing the hooks of a freed model is harmless


def test_decorated_instance_is_freed():
    model = precguard.precision_monitor(Stack())
    train_step(model)
    ref = weakref.ref(model)
    del model
    assert freed(ref)


def test_a_deep_copy_of_a_monitored_model_runs_unrecorded_and_the_original_still_records(
    tmp_path,
):
    # deepcopy copies the modules' hook dicts: the copy's hooks must neither copy the
    # monitor (its recording, its files) nor fail, nor be recorded as the original's calls
    import copy

    model = Stack()
    x = torch.randn(4, 8)
    plain = copy.deepcopy(model)(x)
    with precguard.monitor(model, out=tmp_path / "run") as handle:
        model(x)
        twin = copy.deepcopy(model)
        assert torch.equal(twin(x), plain)  # bitwise what the copy computes unmonitored
        model(x)
    records = list(precguard.load_run(handle.path).records())
    keys = [(r.step, r.key) for r in records]
    assert keys and len(keys) == len(set(keys))  # no call recorded twice under one key
    assert {r.step for r in records} == {0, 1}  # the original's two forwards, the copy's none
    calls = [{r.key for r in records if r.step == s and r.role != "param"} for s in (0, 1)]
    assert calls[0] == calls[1]  # the same calls recorded in each, nothing of the copy's
