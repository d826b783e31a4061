"""torch.compile: a model monitored and then compiled is recorded whole, without dynamo
tracing into precguard; a model compiled before monitor() is refused with one line that
says how (issue 28).

Compiled with ``backend="eager"``: dynamo traces and splits the graph exactly as it
does for inductor, without inductor's minutes of C++ compilation on a CPU.
"""

from __future__ import annotations

import warnings

import pytest
import torch

import precguard
from precguard import UsageError
from precguard.targets import build_tiny_llama

pytest.importorskip("torch._dynamo")


def _tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_tiny_llama(num_hidden_layers=2).eval()


@pytest.fixture
def ids() -> torch.Tensor:
    return torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _keys(path) -> list[str]:
    return [r.key for r in precguard.load_run(path).records(0)]


@pytest.mark.slow  # dynamo traces a 2-layer LLaMA: ~20 s of CPU
def test_monitor_then_compile_records_every_module_without_tracing_into_precguard(tmp_path, ids):
    model = _tiny_llama()
    with torch.no_grad():
        plain = model(ids).logits
    with precguard.monitor(model, tmp_path / "eager"), torch.no_grad():
        model(ids)
    counters = torch._dynamo.utils.counters
    counters.clear()
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        with precguard.monitor(model, tmp_path / "compiled"):
            compiled = torch.compile(model, backend="eager")
            out = compiled(ids).logits
    assert torch.equal(out, plain)  # instrumented output bitwise equal
    assert _keys(tmp_path / "compiled") == _keys(tmp_path / "eager")
    # the graph breaks where torch's module code calls a hook (the hook is not traced),
    # never inside precguard: before, dynamo broke on the statistics kernel, str(int),
    # data-dependent sizes, and recompiled Recording.enter up to its limit
    breaks = list(counters["graph_break"])
    assert breaks and all("capture hook" in b for b in breaks), breaks[:3]
    named = [str(w.message) for w in caught if "precguard" in str(w.message)]
    assert not named, named[:1]
    assert not counters["recompiles"], dict(counters["recompiles"])
    # and both recordings compare as the same model, matching
    result = precguard.compare_runs(tmp_path / "eager", tmp_path / "compiled")
    assert result.verdict == "match"


def test_a_model_compiled_before_monitor_is_refused_with_the_way_out(tmp_path, ids):
    model = _tiny_llama()
    compiled = torch.compile(model, backend="eager")
    with pytest.raises(UsageError) as err:
        precguard.monitor(compiled, tmp_path / "run")
    message = str(err.value)
    assert "already compiled with torch.compile" in message
    assert "before torch.compile(model)" in message and "_orig_mod" in message
    assert not (tmp_path / "run").exists()  # nothing written
    # the way out it names works: the uncompiled module records every module
    with precguard.monitor(compiled._orig_mod, tmp_path / "orig"), torch.no_grad():
        compiled._orig_mod(ids)
    assert len(_keys(tmp_path / "orig")) > 50


@pytest.mark.slow  # dynamo traces a 2-layer LLaMA twice: ~30 s of CPU
def test_the_inner_module_of_a_warm_compiled_wrapper_is_recorded_whole(tmp_path, ids):
    # issue 37: compiled and warmed up, then monitor() on the inner module while the
    # wrapper is called; dynamo reran its hook-less code and 2 records of the root came back
    model = _tiny_llama()
    with torch.no_grad():
        plain = model(ids).logits
    with precguard.monitor(model, tmp_path / "eager"), torch.no_grad():
        model(ids)
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        compiled(ids)  # warm-up: compiled without hooks
    with precguard.monitor(model, tmp_path / "compiled"), torch.no_grad():
        out = compiled(ids).logits
    assert torch.equal(out, plain)
    assert _keys(tmp_path / "compiled") == _keys(tmp_path / "eager")  # every module, not 2
    with torch.no_grad():  # hooks gone, the wrapper still computes the same
        assert torch.equal(compiled(ids).logits, plain)
    assert precguard.compare_runs(tmp_path / "eager", tmp_path / "compiled").verdict == "match"


@pytest.mark.slow  # dynamo traces a 2-layer LLaMA twice
def test_an_instance_decorated_after_its_wrapper_ran_is_recorded_in_a_recording(tmp_path, ids):
    # issue 37, the same for recording(): precision_monitor(model) after the warm-up
    model = _tiny_llama()
    compiled = torch.compile(model, backend="eager")
    with torch.no_grad():
        compiled(ids)
    precguard.precision_monitor(model)
    try:
        with precguard.recording(tmp_path / "run"), torch.no_grad():
            compiled(ids)
    finally:
        precguard.unmonitor(model)
    modules = {r.module for r in precguard.load_run(tmp_path / "run").records(0)}
    assert {"model.layers.0.mlp.down_proj", "model.layers.1.self_attn", "lm_head"} <= modules


def test_a_submodule_compiled_in_place_is_named_in_the_refusal(tmp_path):
    model = _tiny_llama()
    model.model.layers[1].compile(backend="eager")
    with pytest.raises(UsageError, match=r"module model\.layers\.1 is already compiled"):
        precguard.monitor(model, tmp_path / "run")


def test_a_decorated_function_inside_a_compiled_model_is_recorded_without_tracing_precguard(
    tmp_path,
):
    @precguard.precision_monitor
    def gelu_scaled(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x) * 2

    linear = torch.nn.Linear(8, 8)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return linear(gelu_scaled(x)).sum()

    x = torch.randn(4, 8)
    counters = torch._dynamo.utils.counters
    counters.clear()
    with precguard.recording(tmp_path / "run"), torch.no_grad():
        out = torch.compile(forward, backend="eager")(x)
    with torch.no_grad():
        assert torch.equal(out, forward(x))
    names = {r.module for r in precguard.load_run(tmp_path / "run").records(0)}
    assert any("gelu_scaled" in n for n in names)
    breaks = list(counters["graph_break"])
    assert all("capture hook" in b for b in breaks), breaks[:3]
    assert not counters["recompiles"]


@pytest.mark.slow  # dynamo traces a small MLP's forward and backward a few times
def test_watch_on_the_inner_module_of_a_warm_compiled_wrapper_records_every_layer(tmp_path):
    from tests.watch.conftest import TinyNet, batch

    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    compiled = torch.compile(model, backend="eager")

    def train_step(step: int) -> torch.Tensor:
        x, y = batch(step)
        loss = torch.nn.functional.mse_loss(compiled(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss

    train_step(0)  # warm-up: compiled without hooks
    with pytest.raises(UsageError, match=r"watch\(\): the model is already compiled"):
        precguard.watch(compiled, opt, out=tmp_path / "refused")
    with precguard.watch(model, opt, every=2, out=tmp_path / "w") as w:
        for step in range(1, 5):
            w.step(train_step(step))
    records = list(precguard.load_run(w.recording_path).records())
    for step in sorted({r.step for r in records}):
        modules = {r.module for r in records if r.step == step and r.phase == "forward"}
        assert {"inp", "hidden", "out"} <= modules, (step, modules)
