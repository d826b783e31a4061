"""Op-level capture: which torch ops ran inside each module, in which dtype."""

from __future__ import annotations

import pydantic
import pytest
import torch
from torch import nn, relu

import precguard
from precguard import Run


def _records(path):
    return list(Run(path).records())


def _ops_in(records, module: str) -> list[str]:
    """Op names run directly in ``module``, in execution order (one per op call)."""
    prefix = module + ".op."
    return [
        r.module[len(prefix) :]
        for r in records
        if r.module.startswith(prefix) and r.role == "output" and r.index == 0
    ]


def test_op_capture_names_the_softmax_matmul_rsqrt_inside_each_llama_layer(
    tiny_llama, input_ids, tmp_path
):
    with torch.no_grad():
        plain = tiny_llama(input_ids).logits
        with precguard.monitor(tiny_llama, out=tmp_path / "run", level="both", backward=False):
            instrumented = tiny_llama(input_ids).logits
    assert torch.equal(plain, instrumented)  # bitwise: the ops returned what they computed
    records = _records(tmp_path / "run")
    keys = {r.key for r in records}
    for layer in range(4):
        attn = f"model.layers.{layer}.self_attn"
        assert f"{attn}.op.softmax.0.forward.output.0" in keys
        assert _ops_in(records, attn).count("matmul") == 2  # q @ k^T, then weights @ v
        assert "rsqrt" in _ops_in(records, f"model.layers.{layer}.input_layernorm")
        assert f"{attn}.q_proj.op.linear.0.forward.output.0" in keys
    # module records are still there beside the ops
    assert "model.layers.0.self_attn.0.forward.output.0" in keys
    softmax = next(r for r in records if r.key.endswith("self_attn.op.softmax.0.forward.output.0"))
    assert softmax.module_type == "torch.nn.functional.softmax"
    assert softmax.dtype == "float32" and softmax.shape == [2, 4, 16, 16]
    assert softmax.stats is not None and softmax.stats.numel == 2 * 4 * 16 * 16
    # the softmax's input is recorded too: what compare judges the op by
    assert "model.layers.0.self_attn.op.softmax.0.forward.input.0" in keys


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = relu(self.lin(x))  # imported from torch: no patched namespace would see it
        return (h * 2).softmax(-1).view(-1)


def test_function_level_sees_imported_functions_and_skips_layout_and_precguard_ops(tmp_path):
    torch.manual_seed(0)
    model = _Block()
    x = torch.randn(4, 8)
    plain = model(x)
    with precguard.monitor(model, out=tmp_path / "run", level="both"):
        got = model(x)
    assert torch.equal(plain, got)
    ops = {r.module for r in _records(tmp_path / "run") if ".op." in r.module}
    assert ops == {"lin.op.linear", "root.op.relu", "root.op.mul", "root.op.softmax"}
    # none of precguard's own statistics (aminmax, vector_norm, count_nonzero, detach,
    # float) and no view: layout ops are exact and skipped unless asked for
    assert torch._C._len_torch_function_stack() == 0  # the mode left with the forward


def test_op_and_module_filters_select_what_is_recorded(tiny_llama, input_ids, tmp_path):
    with (
        torch.no_grad(),
        precguard.monitor(
            tiny_llama,
            out=tmp_path / "run",
            level="op",
            ops=["softmax", "rsqrt"],
            op_modules=["model.layers.1.*"],
        ),
    ):
        tiny_llama(input_ids)
    modules = {r.module for r in _records(tmp_path / "run")}
    assert modules == {
        "model.layers.1.self_attn.op.softmax",
        "model.layers.1.input_layernorm.op.rsqrt",
        "model.layers.1.post_attention_layernorm.op.rsqrt",
    }  # level="op": no module records at all


def test_a_pattern_that_names_a_layout_op_records_it(tmp_path):
    model = _Block()
    with precguard.monitor(model, out=tmp_path / "run", level="op", ops=["view", "relu"]):
        model(torch.randn(4, 8))
    assert {r.module for r in _records(tmp_path / "run")} == {"root.op.relu", "root.op.view"}


def test_op_level_steps_follow_the_root_calls(tmp_path):
    model = _Block()
    with precguard.monitor(model, out=tmp_path / "run", level="op", ops=["relu"]):
        model(torch.randn(4, 8))
        model(torch.randn(4, 8))
    steps = sorted({(r.step, r.call) for r in _records(tmp_path / "run")})
    assert steps == [(0, 0), (1, 0)]


def test_aten_level_composes_with_the_emulator_and_keeps_its_output(
    tiny_llama, input_ids, tmp_path
):
    from precguard import resolve_backend

    backend = resolve_backend("emu:bf16")
    with torch.no_grad(), backend.numerics():
        plain = tiny_llama(input_ids).logits
        with precguard.monitor(
            tiny_llama, out=tmp_path / "run", level="op", ops_at="aten", ops=["_softmax", "mm"]
        ):
            emulated = tiny_llama(input_ids).logits
    assert torch.equal(plain, emulated)
    # and it recorded under the emulator: an output-only check passes with no mode at all
    ops = {r.module.rpartition(".op.")[2] for r in _records(tmp_path / "run")}
    assert "_softmax" in ops


def test_aten_level_records_the_dispatched_ops(tmp_path):
    model = _Block()
    with precguard.monitor(model, out=tmp_path / "run", level="op", ops_at="aten"):
        model(torch.randn(4, 8))
    ops = {r.module for r in _records(tmp_path / "run")}
    assert {"lin.op.addmm", "root.op.relu", "root.op._softmax"} <= ops
    assert all(r.module_type.startswith("aten.") for r in _records(tmp_path / "run"))


def test_a_forward_that_raises_leaves_no_mode_behind(tmp_path):
    class Broken(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = torch.relu(x)
            raise RuntimeError("user bug")
            return y

    model = Broken()
    handle = precguard.monitor(model, out=tmp_path / "run2", level="op")
    with pytest.raises(RuntimeError, match="user bug"):
        model(torch.randn(3))
    assert torch._C._len_torch_function_stack() == 0
    handle.remove()
    assert "root.op.relu.0.forward.output.0" in {r.key for r in _records(tmp_path / "run2")}


def test_an_unknown_level_is_an_error_not_a_default():
    with pytest.raises(pydantic.ValidationError, match="level"):
        precguard.monitor(_Block(), level="ops")


def test_record_from_the_cli_at_op_level(tmp_path, capsys):
    from precguard.cli import main

    with pytest.raises(SystemExit) as info:
        main(["record", "-t", "tiny-llama", "--level", "op", "--out", str(tmp_path / "r")])
    assert info.value.code in (0, None)
    keys = {r.key for r in _records(tmp_path / "r")}
    assert "model.layers.3.self_attn.op.softmax.0.forward.output.0" in keys
    with pytest.raises(SystemExit) as info:
        main(["record", "-t", "tiny-llama", "--level", "ops", "--out", str(tmp_path / "s")])
    assert info.value.code == 2
    assert "--level: expected module, op or both" in capsys.readouterr().err


def test_an_op_on_another_device_is_marked_and_its_nan_still_acted_on(tmp_path):
    """A fallback op (here: every CPU op, the capture told the model is elsewhere)."""

    class Log(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return torch.log(x)  # NaN born here from a negative input

    model = Log()
    handle = precguard.monitor(model, out=tmp_path / "run", level="op", on_nonfinite="raise")
    ops = handle.monitor.parts[0]
    ops._device = "elsewhere"
    with pytest.raises(precguard.errors.NonFiniteError):
        model(torch.tensor([1.0, -1.0]))
    handle.remove()
    out = next(r for r in _records(tmp_path / "run") if r.key == "root.op.log.0.forward.output.0")
    assert out.device == "cpu"
