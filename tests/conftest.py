"""Shared fixtures: small real models, seeded."""

from __future__ import annotations

import pytest
import torch

from precguard.targets import build_tiny_llama


@pytest.fixture
def tiny_llama() -> torch.nn.Module:
    """A 4-layer transformers LlamaForCausalLM, hidden 64, seeded init."""
    torch.manual_seed(0)
    return build_tiny_llama().eval()


@pytest.fixture
def input_ids() -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    return torch.randint(0, 256, (2, 16), generator=gen)
