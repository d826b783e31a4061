"""Recordings and results the report tests render.

A tiny LLaMA with a planted fault (the story a report tells), and a
hand-written model whose module names and environment facts are hostile
text: a report must show them as text, never run or fetch them.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from torch import nn

import precguard
from tests.compare.conftest import FAULTS, record

#: the planted fault the comparison report must name
FAULT = next(f for f in FAULTS if f.name == "rmsnorm-fp16-first-layer")

SCRIPT_NAME = "<script>alert(1)</script>"
FORMULA_NAME = "=1+2"
IMG_FACT = "<img src=x onerror=alert(2)>"

# A resource the page would fetch: an attribute or CSS url()/@import naming a
# network location (http:, https: or scheme-relative //). SVG's
# xmlns="http://www.w3.org/2000/svg" is a namespace name, not a fetch.
_FETCH = re.compile(
    r"""(?:\b(?:src|href|xlink:href|srcset|action|poster|data|background)\s*=\s*["']?\s*"""
    r"""|url\(\s*["']?\s*|@import\s+["']?\s*)(?:https?:)?//""",
    re.IGNORECASE,
)


def fetched_resources(page: str) -> list[str]:
    """Every network resource ``page`` references (empty for a self-contained page)."""
    return [m.group(0) for m in _FETCH.finditer(page)]


class Hostile(nn.Module):
    """Two layers, then modules whose names are a script tag and a spreadsheet formula."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
        self.add_module(SCRIPT_NAME, nn.Linear(16, 16))
        self.add_module(FORMULA_NAME, nn.Linear(16, 16))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = torch.tanh(layer(x))
        x = getattr(self, SCRIPT_NAME)(x)
        return getattr(self, FORMULA_NAME)(x)


def record_hostile(out: Path, *, fault: bool, fact: str) -> Path:
    """Record one forward of :class:`Hostile` (full tensors); ``fault`` scales the script module."""
    torch.manual_seed(0)
    model = Hostile()
    if fault:
        getattr(model, SCRIPT_NAME).register_forward_hook(lambda _m, _a, out: out * 1.01)
    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(1))
    with (
        torch.no_grad(),
        precguard.monitor(model, out=out, tensors=True, fingerprint={"driver": fact}),
    ):
        model(x)
    return out


@pytest.fixture(scope="session")
def llama_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(golden, actual): tiny-llama, and the same with an fp16 RMSNorm in layer 0 plus noise."""
    root = tmp_path_factory.mktemp("report-llama")
    return record(root / "golden"), record(root / "actual", fault=FAULT, noise=True)


@pytest.fixture(scope="session")
def hostile_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(golden, actual) of :class:`Hostile`; the actual's script-named module drifts by 1%."""
    root = tmp_path_factory.mktemp("report-hostile")
    return (
        record_hostile(root / "golden", fault=False, fact="driver 1"),
        record_hostile(root / "actual", fault=True, fact=IMG_FACT),
    )
