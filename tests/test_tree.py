"""The one walker of nested values: every container a model's batch or output can be."""

from __future__ import annotations

import dataclasses
from collections import OrderedDict, UserDict, namedtuple
from pathlib import Path

import pytest
import torch
from transformers import BatchEncoding
from transformers.modeling_outputs import CausalLMOutput

import precguard
from precguard import tree
from precguard.capture.flatten import named_tensors
from precguard.target import Target, call_model, move_batch
from precguard.targets import build_tiny_llama, lm_batch

Pair = namedtuple("Pair", ["first", "second"])


@dataclasses.dataclass(frozen=True)
class Frame:
    pixels: torch.Tensor
    label: str


def _every_container() -> dict[str, object]:
    a, b = torch.ones(2), torch.zeros(3)
    return {
        "dict": {"a": a, "b": b},
        "user_dict": UserDict({"a": a, "b": b}),
        "batch_encoding": BatchEncoding({"a": a, "b": b}),
        "model_output": CausalLMOutput(loss=a, logits=b),
        "ordered": OrderedDict(a=a, b=b),
        "namedtuple": Pair(a, b),
        "tuple": (a, b),
        "list": [a, b],
        "dataclass": Frame(a, "cat"),
    }


@pytest.mark.parametrize("kind", list(_every_container()))
def test_every_container_is_walked_and_rebuilt_as_its_own_type(kind: str) -> None:
    value = _every_container()[kind]
    assert len(tree.tensors(value)) == (1 if kind == "dataclass" else 2)
    doubled = tree.map_tensors(value, lambda t: t + 1)
    assert type(doubled) is type(value)
    assert [t.sum().item() for t in tree.tensors(doubled)] == [
        t.sum().item() + t.numel() for t in tree.tensors(value)
    ]
    assert tree.tensors(value)[0].sum().item() == 2.0  # the input is left as it was


def test_capture_names_the_tensors_of_a_batch_encoding_like_a_dict() -> None:
    ids = torch.arange(4)
    assert named_tensors(BatchEncoding({"input_ids": ids}), "kwargs") == named_tensors(
        {"input_ids": ids}, "kwargs"
    )


def test_moving_a_batch_encoding_keeps_it_a_batch_encoding_on_the_device() -> None:
    batch = BatchEncoding({"input_ids": torch.arange(4), "attention_mask": torch.ones(4)})
    moved = move_batch(batch, torch.device("meta"))
    assert isinstance(moved, BatchEncoding)
    assert moved.input_ids.device.type == "meta" and moved["attention_mask"].is_meta
    assert batch.input_ids.device.type == "cpu"


def test_a_batch_encoding_is_passed_as_keyword_arguments() -> None:
    seen = {}

    class Model(torch.nn.Module):
        def forward(self, input_ids, attention_mask=None):
            seen.update(input_ids=input_ids, attention_mask=attention_mask)
            return input_ids

    batch = BatchEncoding({"input_ids": torch.arange(3), "attention_mask": torch.ones(3)})
    call_model(Model(), batch)
    assert seen["attention_mask"] is batch["attention_mask"]


def test_a_tokenizer_batch_records_end_to_end(tmp_path: Path) -> None:
    """A target whose batch is what a tokenizer returns: model(**batch), moved to the device."""

    def batch(step: int) -> BatchEncoding:
        ids = lm_batch(step, seq=8)["input_ids"]
        return BatchEncoding({"input_ids": ids, "attention_mask": torch.ones_like(ids)})

    target = Target(model=lambda: build_tiny_llama(num_hidden_layers=1), batch=batch, name="tok")
    run = precguard.load_run(
        precguard.record_target(target, device="emu:bf16", out=tmp_path / "run")
    )
    root_inputs = {r.name for r in run.records() if r.module == "root" and r.role == "input"}
    assert {"kwargs.input_ids", "kwargs.attention_mask"} <= root_inputs


class _Cache:
    """A leaf that holds tensors (a KV cache): never walked."""

    def __init__(self) -> None:
        self.keys = [torch.ones(1)]


@pytest.mark.parametrize("kind", sorted(_every_container()))
def test_capture_names_exactly_the_tensors_the_reference_walker_finds(kind: str) -> None:
    # named_tensors decides how to walk a value once per type (it runs in every hook);
    # children(), which asks each value, is the reference: the same tensors, the same paths
    value = _every_container()[kind]
    nested = {
        "x": value,
        "deeper": [value, (value, None)],
        "leaves": (Frame, _Cache(), True, None, 3, "s", torch.float16),
    }
    for v in (value, nested):
        expected = [
            (".".join(["kwargs", *map(str, keys)]), leaf)
            for keys, leaf in tree.leaves(v, max_depth=6)
            if isinstance(leaf, torch.Tensor)
        ]
        got = named_tensors(v, "kwargs")
        assert [n for n, _ in got] == [n for n, _ in expected]
        assert all(a is b for (_, a), (_, b) in zip(got, expected, strict=True))
