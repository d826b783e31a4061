"""The bf16 localization suite: planted faults in an HF LLaMA whose actual run is in bf16.

Four settings, each a golden and an actual recipe (issue 8):

- ``bf16-vs-fp32``: the actual is the model cast to bf16 on the CPU; the golden
  runs in fp32 with the same bf16-rounded weights and buffers.
- ``emu-bf16-vs-fp32``: the same golden; the actual runs on ``emu:bf16`` (every
  op's inputs and result rounded to bf16, fp32 accumulation, tensors stored as
  float32: only the recording's compute_dtype says bf16).
- ``emu-bf16-mixed-vs-fp32``: the same on ``emu:bf16-mixed`` (the model stored in
  bf16, the fp32 islands its code asks for kept).
- ``lowacc-vs-bf16``: both in bf16; the golden on the CPU, the actual on
  ``emu:bf16-lowacc``, whose matmuls keep their running sums in bf16.

Every fault changes what exactly one named module computes; five are
systematic ~1% biases (a projection's output or weight scaled) that hide
inside bf16 noise element by element. ``benchmarks/bf16_localization.py``
runs the whole suite and prints its score; ``test_compare_bf16.py`` asserts it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

import precguard

Prepare = Callable[[nn.Module], None]


@dataclass(frozen=True)
class Fault:
    """A planted fault: a name, the module it lives in, how to plant it, and whether it is
    a small systematic bias (the kind element-wise tolerances cannot see)."""

    name: str
    module: str
    plant: Prepare
    bias: bool = False


def _output_scaled(factor: float) -> Prepare:
    def plant(module: nn.Module) -> None:
        module.register_forward_hook(lambda _m, _args, out: out * factor)

    return plant


def _weight_scaled(factor: float) -> Prepare:
    def plant(module: nn.Module) -> None:
        with torch.no_grad():
            module.weight.mul_(factor)

    return plant


def _eps(value: float) -> Prepare:
    def plant(module: nn.Module) -> None:
        module.variance_epsilon = value

    return plant


def _gelu_instead(module: nn.Module) -> None:
    module.forward = lambda x: torch.nn.functional.gelu(x, approximate="tanh")


def _rope_positions_shifted(module: nn.Module) -> None:
    original = module.forward

    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return original(x, position_ids + 1)

    module.forward = forward


FAULTS: list[Fault] = [
    Fault("embed-weight-x1.01", "model.embed_tokens", _weight_scaled(1.01), bias=True),
    Fault("rope-positions-shifted", "model.rotary_emb", _rope_positions_shifted),
    Fault(
        "q-proj-output-x1.01", "model.layers.0.self_attn.q_proj", _output_scaled(1.01), bias=True
    ),
    Fault(
        "o-proj-weight-x0.99", "model.layers.1.self_attn.o_proj", _weight_scaled(0.99), bias=True
    ),
    Fault("post-norm-eps-1e-3", "model.layers.1.post_attention_layernorm", _eps(1e-3)),
    Fault("up-proj-output-x1.01", "model.layers.2.mlp.up_proj", _output_scaled(1.01), bias=True),
    Fault("gelu-for-silu", "model.layers.2.mlp.act_fn", _gelu_instead),
    Fault(
        "down-proj-output-x0.99", "model.layers.3.mlp.down_proj", _output_scaled(0.99), bias=True
    ),
    Fault("lm-head-output-x1.01", "lm_head", _output_scaled(1.01), bias=True),
]


def round_to_bf16(model: nn.Module) -> None:
    """Round every float parameter and buffer to bf16 in place, keeping its dtype."""
    with torch.no_grad():
        for t in [*model.parameters(), *model.buffers()]:
            if t.is_floating_point():
                t.copy_(t.to(torch.bfloat16).to(t.dtype))


@dataclass(frozen=True)
class Setting:
    """One golden/actual pairing of the suite."""

    name: str
    golden: dict[str, object]
    actual: dict[str, object]


SETTINGS: list[Setting] = [
    Setting("bf16-vs-fp32", {"device": "cpu"}, {"device": "cpu", "dtype": "bfloat16"}),
    Setting("emu-bf16-vs-fp32", {"device": "cpu"}, {"device": "emu:bf16"}),
    Setting("emu-bf16-mixed-vs-fp32", {"device": "cpu"}, {"device": "emu:bf16-mixed"}),
    Setting(
        "lowacc-vs-bf16",
        {"device": "cpu", "dtype": "bfloat16"},
        {"device": "emu:bf16-lowacc", "dtype": "bfloat16"},
    ),
]


def llama_target(hidden: int = 64, layers: int = 4, seq: int = 32) -> precguard.Target:
    """tiny-llama at another size (at least 4 layers: the faults live in layers 0-3)."""
    from precguard.targets import build_tiny_llama, lm_batch, tiny_llama

    if layers < 4:
        raise ValueError("the bf16 suite plants faults in layers 0-3: use at least 4 layers")
    target = tiny_llama()
    if (hidden, layers, seq) == (64, 4, 32):
        return target
    target.model = lambda: build_tiny_llama(
        hidden_size=hidden, intermediate_size=hidden * 11 // 4, num_hidden_layers=layers
    )
    target.batch = lambda step: lm_batch(step, seq=seq)
    target.name = f"tiny-llama-h{hidden}-l{layers}-s{seq}"
    return target


def record(
    out: Path,
    how: dict[str, object],
    fault: Fault | None = None,
    target: precguard.Target | None = None,
) -> Path:
    """Record one forward step of tiny-llama (or ``target``) with full tensors, weights
    rounded to bf16."""

    def prepare(model: nn.Module) -> None:
        round_to_bf16(model)
        if fault is not None:
            fault.plant(model.get_submodule(fault.module))

    return precguard.record_target(
        target or "tiny-llama", out=out, tensors=True, prepare=prepare, **how
    )  # type: ignore[arg-type]


def localized(result: precguard.Comparison, fault: Fault) -> bool:
    """True when compare names the planted module as the first divergence, local."""
    fd = result.first_divergence
    return (
        result.verdict == "diverged"
        and fd is not None
        and fd.module == fault.module
        and fd.local is True
    )


def passed_clean(result: precguard.Comparison) -> bool:
    """True when a clean actual matches and no module is named."""
    return result.verdict == "match" and result.first_divergence is None and not result.suspects
