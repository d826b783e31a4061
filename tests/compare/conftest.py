"""Planted faults and benign background noise for the compare tests.

A fault is a ``prepare(model)`` callable for :func:`precguard.record_target`
that changes what exactly one named module computes. Background noise makes
every ``nn.Linear`` reduce over its inner dimension in a different order:
different but equally accurate arithmetic in every layer, which is what two
real backends look like.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

import precguard

Prepare = Callable[[nn.Module], None]


@dataclass(frozen=True)
class Fault:
    """A planted fault: a name, the module it lives in, and how to plant it."""

    name: str
    module: str
    plant: Prepare


def _rmsnorm_fp16(module: nn.Module) -> None:
    def forward(hidden_states: torch.Tensor) -> torch.Tensor:
        h = hidden_states.to(torch.float16)
        variance = h.pow(2).mean(-1, keepdim=True)
        h = h * torch.rsqrt(variance + module.variance_epsilon)
        return (module.weight.to(torch.float16) * h).to(hidden_states.dtype)

    module.forward = forward


def _rope_fp16(module: nn.Module) -> None:
    original = module.forward

    def forward(x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = original(x.to(torch.float16), position_ids)
        return cos.to(x.dtype), sin.to(x.dtype)

    module.forward = forward


def _output_drift(factor: float) -> Callable[[nn.Module], None]:
    def plant(module: nn.Module) -> None:
        module.register_forward_hook(lambda _m, _args, out: out * factor)

    return plant


def _weight_drift(factor: float) -> Callable[[nn.Module], None]:
    def plant(module: nn.Module) -> None:
        with torch.no_grad():
            module.weight.mul_(factor)

    return plant


def _softmax_bf16(module: nn.Module) -> None:
    original = module.forward
    real = torch.nn.functional.softmax

    def low(x: torch.Tensor, dim: int | None = None, dtype: torch.dtype | None = None, **kw):
        return real(x.to(torch.bfloat16), dim=dim).to(dtype or x.dtype)

    def forward(*args, **kwargs):
        torch.nn.functional.softmax = low
        try:
            return original(*args, **kwargs)
        finally:
            torch.nn.functional.softmax = real

    module.forward = forward


def _gelu_instead(module: nn.Module) -> None:
    module.forward = lambda x: torch.nn.functional.gelu(x, approximate="tanh")


def _eps(value: float) -> Callable[[nn.Module], None]:
    def plant(module: nn.Module) -> None:
        module.variance_epsilon = value

    return plant


def _bf16_compute(module: nn.Module) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x.bfloat16(), module.weight.bfloat16()).to(x.dtype)

    module.forward = forward


FAULTS: list[Fault] = [
    Fault("rmsnorm-fp16-first-layer", "model.layers.0.input_layernorm", _rmsnorm_fp16),
    Fault("rope-fp16", "model.rotary_emb", _rope_fp16),
    Fault("output-drift-0.1pct", "model.layers.1.mlp.down_proj", _output_drift(1.001)),
    Fault("weight-drift-0.05pct", "model.layers.2.self_attn.k_proj", _weight_drift(1.0005)),
    Fault("softmax-bf16-in-attention", "model.layers.2.self_attn", _softmax_bf16),
    Fault("gelu-for-silu-last-layer", "model.layers.3.mlp.act_fn", _gelu_instead),
    Fault("final-norm-eps-changed", "model.norm", _eps(1e-3)),
    Fault("lm-head-bf16", "lm_head", _bf16_compute),
]


def _split_k_linear(module: nn.Linear) -> None:
    def forward(x: torch.Tensor) -> torch.Tensor:
        k = x.shape[-1]
        half = (k // 2) or 1
        out = nn.functional.linear(x[..., half:], module.weight[:, half:])
        out = out + nn.functional.linear(x[..., :half], module.weight[:, :half])
        return out if module.bias is None else out + module.bias

    module.forward = forward


def background_noise(model: nn.Module) -> None:
    """Make every Linear reduce in another (equally accurate) order: split-K, high half first."""
    for mod in model.modules():
        if isinstance(mod, nn.Linear):
            _split_k_linear(mod)


def planting(fault: Fault | None, noise: bool) -> Prepare:
    """A prepare() that plants ``fault`` (if any) after the background noise (if asked)."""

    def prepare(model: nn.Module) -> None:
        if noise:
            background_noise(model)
        if fault is not None:
            fault.plant(model.get_submodule(fault.module))

    return prepare


def record(out: Path, *, fault: Fault | None = None, noise: bool = False, **kw) -> Path:
    """Record tiny-llama with full tensors (one forward step) into ``out``."""
    kw.setdefault("tensors", True)
    return precguard.record_target("tiny-llama", out=out, prepare=planting(fault, noise), **kw)


@pytest.fixture(scope="session")
def tiny_golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama recorded on the CPU in fp32 with every tensor: the golden run."""
    return record(tmp_path_factory.mktemp("golden") / "run")


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the precguard CLI in-process; return (exit code, stdout, stderr)."""
    from precguard.cli import main

    capsys.readouterr()
    try:
        main(args)
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out, err = capsys.readouterr()
    return code, out, err
