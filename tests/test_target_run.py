"""The set-up record, replay, bisect, op-check and the checks share: one TargetRun."""

from __future__ import annotations

import sys

import pytest
import torch
from torch import nn

from precguard import Target, TargetError, TargetRun, UsageError


def _target(batch=lambda step: torch.ones(2, 4)) -> Target:
    return Target(model=lambda: nn.Linear(4, 4), batch=batch, name="lin")


def test_the_dtype_falls_back_to_the_backends_storage_dtype_then_fp32() -> None:
    assert TargetRun.open(_target(), "emu:fp16-mixed").dtype is torch.float16
    assert TargetRun.open(_target(), "cpu").dtype is torch.float32
    assert TargetRun.open(_target(), "cpu", "bf16").dtype is torch.bfloat16


def test_a_bad_dtype_is_reported_before_the_target_is_imported() -> None:
    with pytest.raises(UsageError, match="unknown dtype 'fp17'"):
        TargetRun.open("no/such/file.py:target", "cpu", "fp17")


def test_two_builds_have_the_same_weights_and_land_on_the_device_in_its_dtype() -> None:
    run = TargetRun.open(_target(), "cpu", "float64")
    first, second = run.build_model(), run.build_model()
    assert first.weight.dtype is torch.float64
    assert torch.equal(first.weight, second.weight)


def test_a_target_calling_sys_exit_in_its_batch_is_named_not_obeyed() -> None:
    run = TargetRun.open(_target(batch=lambda step: sys.exit(3)), "cpu")
    with pytest.raises(TargetError, match=r"target 'lin': batch\(0\) called sys.exit\(3\)"):
        run.batch(0)


def test_doing_lets_the_exception_through_and_remembers_what_raised() -> None:
    run = TargetRun.open(_target(), "cpu")
    with pytest.raises(ZeroDivisionError), run.doing("step 0: loss()"):
        raise ZeroDivisionError("x")
    assert str(run.error(ZeroDivisionError("x"))) == (
        "target 'lin': step 0: loss() raised ZeroDivisionError: x"
    )
    with run.doing("batch(1)"):
        pass
    assert run.running is None
