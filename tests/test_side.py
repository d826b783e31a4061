"""One side of a comparison said once: ``precguard.Side`` (target, device, dtype, set-up).

The user who writes ``Side("tiny-llama", "emu:bf16", prepare=plant)`` gets
exactly what the older keywords (``device=``, ``dtype=``, ``prepare=``) give,
from every entry point that runs a target: a recording, a bisection, a
generate-diff. Saying a side twice (a Side and a keyword for it) is refused.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import nn

import precguard
from precguard import Side, UsageError


def plant(model: nn.Module) -> None:
    """A fault the device must show: the last layer's MLP output scaled up (the test's bug)."""
    with torch.no_grad():
        down = model.model.layers[-1].mlp.down_proj.weight
        down.mul_(64.0)


def _without_timing(value: Any) -> Any:
    """``value`` (a result's dump) without the wall-clock fields, which differ run to run."""
    if isinstance(value, dict):
        return {k: _without_timing(v) for k, v in value.items() if "second" not in k}
    if isinstance(value, list):
        return [_without_timing(v) for v in value]
    return value


def test_a_recording_made_from_a_side_is_bitwise_the_keyword_recording(tmp_path) -> None:
    side = Side("tiny-llama", "emu:bf16", prepare=plant)
    by_side = precguard.record_target(side, out=tmp_path / "side", hashes=True)
    by_keywords = precguard.record_target(
        "tiny-llama", device="emu:bf16", prepare=plant, out=tmp_path / "kw", hashes=True
    )
    same = precguard.compare_bitwise(by_keywords, by_side)
    assert same.verdict == "identical" and same.compared > 0
    manifest = precguard.load_run(by_side).manifest
    assert (manifest.device, manifest.target) == ("emu:bf16", "tiny-llama")
    # and the side's set-up ran: without it the recording differs
    plain = side.replace(prepare=None)
    plain_path = precguard.record_target(plain, out=tmp_path / "plain", hashes=True)
    assert precguard.compare_bitwise(plain_path, by_side).verdict == "differs"


def test_a_bisection_of_a_side_is_the_keyword_bisection() -> None:
    side = Side("tiny-llama", "emu:fp16", prepare=plant)
    by_side = precguard.bisect(side)
    by_keywords = precguard.bisect("tiny-llama", device="emu:fp16", prepare=plant)
    assert by_side.model_dump() == by_keywords.model_dump()
    assert by_side.device == "emu:fp16" and by_side.probe_count >= 1


def test_generate_diff_of_two_sides_is_the_keyword_generate_diff() -> None:
    golden, actual = Side("tiny-llama"), Side("tiny-llama", "emu:bf16", prepare=plant)
    common: dict[str, Any] = {"max_new_tokens": 3, "layerwise": False}
    by_sides = precguard.generate_diff(golden=golden, actual=actual, **common)
    by_keywords = precguard.generate_diff("tiny-llama", device="emu:bf16", prepare=plant, **common)
    assert _without_timing(by_sides.model_dump()) == _without_timing(by_keywords.model_dump())
    assert (by_sides.golden.device, by_sides.actual.device) == ("cpu", "emu:bf16")
    # the golden defaults to the actual's target on the CPU
    alone = precguard.generate_diff(actual=actual, **common)
    assert _without_timing(alone.model_dump()) == _without_timing(by_sides.model_dump())


@pytest.mark.parametrize(
    ("call", "named"),
    [
        (lambda: precguard.record_target(Side("tiny-llama"), device="cpu", out="x"), "device"),
        (lambda: precguard.bisect(Side("tiny-llama", "emu:bf16"), dtype="float16"), "dtype"),
        (lambda: precguard.bisect("tiny-llama"), "no device"),
        (
            lambda: precguard.generate_diff(
                "tiny-llama", device="cpu", golden=Side("tiny-llama"), reference="cpu"
            ),
            "reference",
        ),
        (lambda: precguard.generate_diff("tiny-llama", actual=Side("tiny-llama")), "target"),
    ],
)
def test_a_side_said_twice_or_not_at_all_is_a_usage_error(call: Any, named: str) -> None:
    with pytest.raises(UsageError, match=named):
        call()


def test_replay_and_op_check_of_a_side_are_the_keyword_ones(tmp_path) -> None:
    module = "model.layers.0.mlp"
    golden = precguard.record_target(Side("tiny-llama"), out=tmp_path / "g", tensors=[module])
    actual = Side("tiny-llama", "emu:bf16", prepare=plant)
    by_side = precguard.replay_module(golden, module, target=actual)
    by_keywords = precguard.replay_module(golden, module, target="tiny-llama", device="emu:bf16")
    # replay takes its weights from the target: the layer-0 MLP is not the planted layer
    assert by_side.model_dump() == by_keywords.model_dump()
    assert by_side.device == "emu:bf16"

    swept = precguard.op_check(side=actual, module=module, seq_lens="8")
    kw = precguard.op_check(device="emu:bf16", target="tiny-llama", module=module, seq_lens="8")
    assert swept.model_dump() == kw.model_dump() and swept.results
