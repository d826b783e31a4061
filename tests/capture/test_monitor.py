"""monitor(): records every module, changes nothing, leaves nothing behind."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import precguard
from tests.capture.models import Branchy, Stack


def hook_count(model: nn.Module) -> int:
    total = 0
    for m in model.modules():
        total += len(m._forward_hooks) + len(m._forward_pre_hooks)
        total += len(m._forward_hooks_with_kwargs) + len(m._forward_pre_hooks_with_kwargs)
        total += len(m._backward_hooks)
        for p in m.parameters(recurse=False):
            total += len(getattr(p, "_post_accumulate_grad_hooks", None) or {})
    return total


def test_llama_outputs_and_grads_bitwise_equal(tiny_llama, input_ids, tmp_path):
    plain = tiny_llama(input_ids, labels=input_ids)
    plain.loss.backward()
    plain_grads = [p.grad.clone() for p in tiny_llama.parameters()]
    tiny_llama.zero_grad(set_to_none=True)

    with precguard.monitor(tiny_llama, out=tmp_path / "run", tensors=True):
        watched = tiny_llama(input_ids, labels=input_ids)
        watched.loss.backward()

    assert torch.equal(plain.logits, watched.logits)
    assert torch.equal(plain.loss, watched.loss)
    for g0, p in zip(plain_grads, tiny_llama.parameters(), strict=True):
        assert torch.equal(g0, p.grad)
    assert hook_count(tiny_llama) == 0


def test_hooks_removed_after_exception(tiny_llama, input_ids, tmp_path):
    before = hook_count(tiny_llama)
    with (
        pytest.raises(RuntimeError, match="boom"),
        precguard.monitor(tiny_llama, out=tmp_path / "run"),
    ):
        tiny_llama(input_ids)
        raise RuntimeError("boom")
    assert hook_count(tiny_llama) == before == 0
    # the recording is closed and readable, and says the run did not finish
    run = precguard.load_run(tmp_path / "run")
    assert run.manifest.complete is False
    assert run.manifest.error is not None and run.manifest.error.type == "RuntimeError"
    assert run.manifest.error.message == "boom"
    assert run.manifest.steps == 1
    assert any(True for _ in run.records())


def test_every_module_recorded_in_execution_order(tiny_llama, input_ids, tmp_path):
    executed: list[str] = []
    names = {m: n or "root" for n, m in tiny_llama.named_modules()}
    handles = [
        m.register_forward_pre_hook(lambda mod, _a: executed.append(names[mod]))
        for m in tiny_llama.modules()
    ]
    try:
        with torch.no_grad(), precguard.monitor(tiny_llama, out=tmp_path / "run"):
            tiny_llama(input_ids)
    finally:
        for h in handles:
            h.remove()

    records = list(precguard.load_run(tmp_path / "run").records())
    first_input_order: list[str] = []
    for r in records:
        if r.role == "input" and r.module not in first_input_order:
            first_input_order.append(r.module)
    # Every module that ran has input records, in the order the modules ran.
    assert first_input_order == executed
    outputs = {r.module for r in records if r.role == "output"}
    assert outputs == set(executed)
    assert [r.seq for r in records] == sorted(r.seq for r in records)
    keys = [r.key for r in records]
    assert len(keys) == len(set(keys))
    assert "model.layers.3.mlp.down_proj.0.forward.output.0" in keys
    assert "root.0.forward.output.0" in keys


def test_nested_outputs_and_kwargs(tmp_path):
    torch.manual_seed(0)
    model = Branchy()
    x = torch.randn(3, 8)
    plain = model(x, scale=2.0)
    with precguard.monitor(model, out=tmp_path / "run"):
        watched = model(x, scale=2.0)
    assert torch.equal(plain[0], watched[0])
    assert torch.equal(plain[1]["b"], watched[1]["b"])
    assert torch.equal(plain[2].aux, watched[2].aux)
    recs = {r.key: r for r in precguard.load_run(tmp_path / "run").records()}
    root_outputs = [r.name for r in recs.values() if r.module == "root" and r.role == "output"]
    assert root_outputs == ["output.0", "output.1.b", "output.2.main", "output.2.aux"]
    assert recs["a.0.forward.param.0"].name == "weight"
    assert recs["a.0.forward.param.1"].name == "bias"


def test_steps_follow_root_calls_and_backward_joins_its_forward(tmp_path):
    torch.manual_seed(0)
    model = Stack()
    with precguard.monitor(model, out=tmp_path / "run") as mon:
        for _ in range(3):
            model(torch.randn(2, 8, requires_grad=True)).sum().backward()
        assert mon.recording.step_index == 2
    run = precguard.load_run(tmp_path / "run")
    records = list(run.records())
    assert {r.step for r in records} == {0, 1, 2}
    assert run.manifest.steps == 3
    for step in range(3):
        phases = [r.phase for r in records if r.step == step]
        assert "backward" in phases
        # backward of step s comes after forward of step s, before step s+1
        last_fwd = max(i for i, r in enumerate(records) if r.step == step and r.phase == "forward")
        first_bwd = min(
            i for i, r in enumerate(records) if r.step == step and r.phase == "backward"
        )
        assert first_bwd > last_fwd
    grads = [r for r in records if r.role == "grad" and r.step == 0]
    assert {r.module for r in grads} == {"blocks.0", "blocks.1", "blocks.2"}
    out_grads = [r.key for r in records if r.phase == "backward" and r.role == "output"]
    assert "blocks.2.0.backward.output.0" in out_grads


def test_explicit_steps(tmp_path):
    torch.manual_seed(0)
    model = Stack()
    out = tmp_path / "run"
    with torch.no_grad(), precguard.monitor(model, out=out, auto_step=False) as mon:
        model(torch.randn(2, 8))
        model(torch.randn(2, 8))  # two calls in one explicit step
        mon.step()
        model(torch.randn(2, 8))
        mon.step()
    records = list(precguard.load_run(tmp_path / "run").records())
    step0_root_calls = {r.call for r in records if r.step == 0 and r.module == "root"}
    assert step0_root_calls == {0, 1}
    assert {r.step for r in records} == {0, 1}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_dtypes_recorded(dtype, tiny_llama, input_ids, tmp_path):
    model = tiny_llama.to(dtype)
    with torch.no_grad():
        plain = model(input_ids).logits
        with precguard.monitor(model, out=tmp_path / "run"):
            watched = model(input_ids).logits
    assert torch.equal(plain, watched)
    run = precguard.load_run(tmp_path / "run")
    assert run.manifest.dtype == str(dtype).removeprefix("torch.")
    rec = next(
        r for r in run.records() if r.key == "model.layers.1.mlp.down_proj.0.forward.output.0"
    )
    assert rec.dtype == str(dtype).removeprefix("torch.")
    out = model.model.layers[1].mlp.down_proj
    assert rec.stats is not None and rec.stats.numel == 2 * 16 * out.out_features


def test_tensor_globs_save_only_matching_modules(tiny_llama, input_ids, tmp_path):
    with (
        torch.no_grad(),
        precguard.monitor(tiny_llama, out=tmp_path / "run", tensors=["model.layers.2.*"]),
    ):
        tiny_llama(input_ids)
    run = precguard.load_run(tmp_path / "run")
    saved = [r for r in run.records() if r.tensor is not None]
    assert saved
    assert {r.module for r in saved} >= {"model.layers.2", "model.layers.2.mlp.down_proj"}
    assert all(r.module.startswith("model.layers.2") for r in saved)
    rec = next(r for r in saved if r.key == "model.layers.2.mlp.0.forward.output.0")
    t = run.tensor(rec)
    assert t.dtype == torch.float32
    assert list(t.shape) == rec.shape
    assert t.abs().max().item() == pytest.approx(rec.stats.absmax, rel=1e-6)
    assert not list(tmp_path.glob("run/rank0/*.tmp"))


def test_refuses_nonempty_directory_unless_overwrite(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    (out / "mine.txt").write_text("user data")
    model = Stack()
    with pytest.raises(precguard.PrecguardError, match="not empty"):
        precguard.monitor(model, out=out)
    with pytest.raises(precguard.PrecguardError, match="not a precguard recording"):
        precguard.monitor(model, out=out, overwrite=True)  # not a recording: never replaced
    assert [p.name for p in out.iterdir()] == ["mine.txt"]
    (out / "mine.txt").unlink()
    with precguard.monitor(model, out=out), torch.no_grad():
        model(torch.randn(1, 8))
    (out / "mine.txt").write_text("user data")
    with precguard.monitor(model, out=out, overwrite=True), torch.no_grad():
        model(torch.randn(1, 8))
    assert (out / "mine.txt").read_text() == "user data"  # only recording files are replaced


def test_failing_hook_reports_once_and_forward_goes_on(tiny_llama, input_ids, tmp_path, caplog):
    from precguard.capture.recording import Recording

    original = Recording.add

    def flaky(self, module, *args, **kwargs):
        if module == "model.layers.1.mlp":
            raise RuntimeError("planted hook failure")
        return original(self, module, *args, **kwargs)

    with torch.no_grad():
        plain = tiny_llama(input_ids).logits
        Recording.add = flaky
        try:
            with (
                caplog.at_level("ERROR", logger="precguard"),
                precguard.monitor(tiny_llama, out=tmp_path / "run"),
            ):
                watched = tiny_llama(input_ids).logits
                tiny_llama(input_ids)
        finally:
            Recording.add = original
    assert torch.equal(plain, watched)
    failures = [r for r in caplog.records if "hook_failed" in r.getMessage()]
    assert len(failures) == 1  # once per module and hook, not once per call
    assert all(r.precguard_data["module"] == "model.layers.1.mlp" for r in failures)
    keys = {r.key for r in precguard.load_run(tmp_path / "run").records()}
    assert "model.layers.2.mlp.0.forward.output.0" in keys


def test_full_tensors_spill_to_disk_in_chunks(tiny_llama, input_ids, tmp_path, monkeypatch):
    from precguard.capture.recording import Recording

    monkeypatch.setattr(Recording, "TENSOR_CHUNK_BYTES", 64 * 1024)
    with torch.no_grad(), precguard.monitor(tiny_llama, out=tmp_path / "run", tensors=True):
        logits_out = tiny_llama(input_ids).logits
    run = precguard.load_run(tmp_path / "run")
    saved = [r for r in run.records() if r.tensor is not None]
    files = {r.tensor.file for r in saved}
    assert len(files) > 3  # one step, written in several chunks
    assert {p.name for p in (tmp_path / "run" / "rank0").glob("*.safetensors")} == files
    logits = next(r for r in saved if r.key == "lm_head.0.forward.output.0")
    assert torch.equal(run.tensor(logits), logits_out)
    for rec in saved:
        assert list(run.tensor(rec).shape) == rec.shape
