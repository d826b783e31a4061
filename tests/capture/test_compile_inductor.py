"""torch.compile with inductor, the default backend: monitoring changes no bit (issue 28).

``test_compile.py`` holds dynamo to precguard's hooks with ``backend="eager"``
(dynamo traces and splits the graph as it does for inductor). Here the whole
default path runs: inductor generates and compiles C++ for the split graphs, and
the monitored compiled model's logits must be bitwise equal to the same model
compiled without monitoring, with no graph break inside precguard, no recompile,
and no warning naming precguard.

Inductor compiles C++ with the host's compiler: without one the test is skipped.
The two compiles of the tiny LLaMA took ~2 min here (53 s and 63 s), ~1 min with
inductor's on-disk cache warm, so it is ``slow``.
"""

from __future__ import annotations

import shutil
import warnings

import pytest
import torch

import precguard
from precguard.targets import build_tiny_llama

pytest.importorskip("torch._inductor")

_COMPILER = next((c for c in ("g++", "c++", "clang++") if shutil.which(c)), None)

pytestmark = [
    pytest.mark.slow,  # two inductor compiles of a 2-layer LLaMA: 1-2 min of CPU
    pytest.mark.skipif(_COMPILER is None, reason="inductor needs a C++ compiler (g++/clang++)"),
]


def _tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_tiny_llama(num_hidden_layers=2).eval()


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_a_model_monitored_then_compiled_with_inductor_computes_the_same_bits(tmp_path):
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        plain = torch.compile(_tiny_llama())(ids).logits
    torch._dynamo.reset()
    eager = _tiny_llama()
    with precguard.monitor(eager, tmp_path / "eager"), torch.no_grad():
        eager(ids)
    counters = torch._dynamo.utils.counters
    counters.clear()
    model = _tiny_llama()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        with precguard.monitor(model, tmp_path / "compiled"):
            out = torch.compile(model)(ids).logits
    assert torch.equal(out, plain)  # bitwise: the monitor changed nothing inductor computes
    # dynamo broke the graph only where torch's module code calls a hook, never inside
    # precguard's code, and compiled nothing twice
    breaks = list(counters["graph_break"])
    assert breaks and all("capture hook" in b for b in breaks), breaks[:3]
    assert not any("precguard/" in b for b in breaks), breaks[:3]
    assert not counters["recompiles"], dict(counters["recompiles"])
    named = [str(w.message) for w in caught if "precguard" in str(w.message)]
    assert not named, named[:1]
    # every module was recorded: the recording compares with an eager one, matching
    result = precguard.compare_runs(tmp_path / "eager", tmp_path / "compiled")
    assert result.verdict == "match", result.first_divergence
    assert not result.unmatched.golden_only and not result.unmatched.actual_only
