"""Graph export and diff: which ops changed dtype, which were fused, between two backends."""

from __future__ import annotations

import json

import pytest
import torch
from transformers.models.llama import modeling_llama

import precguard
from precguard.cli import main
from precguard.graph.build import exported_graph, graph_from_run, load_graph, trace_graph
from precguard.graph.diff import diff_graphs
from precguard.targets import build_tiny_llama


@torch.library.custom_op("precguard_test::fused_rope", mutates_args=())
def fused_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One kernel for RoPE on q and k, as a vendor library ships it."""

    def rotate(x: torch.Tensor) -> torch.Tensor:
        half = x.shape[-1] // 2
        return torch.cat((-x[..., half:], x[..., :half]), dim=-1)

    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


@fused_rope.register_fake
def _(q, k, cos, sin):
    return torch.empty_like(q), torch.empty_like(k)


def _fused_apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1):
    return fused_rope(q, k, cos, sin)


def _forward(model, ids):
    return lambda: model(ids, use_cache=False)


def test_autocast_bf16_lists_the_ops_whose_dtype_changed(tiny_llama, input_ids):
    golden = trace_graph(tiny_llama, _forward(tiny_llama, input_ids))

    def under_autocast():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return tiny_llama(input_ids, use_cache=False)

    actual = trace_graph(tiny_llama, under_autocast)
    diff = diff_graphs(golden, actual)
    assert diff.verdict == "different"
    changed = {(d.module, d.golden_ops[0]) for d in diff.differences if d.kind == "dtype"}
    for layer in range(4):
        attn = f"model.layers.{layer}.self_attn"
        assert (f"{attn}.q_proj", "linear") in changed
        assert (attn, "matmul") in changed  # q @ k^T and weights @ v ran in bfloat16
        assert (f"model.layers.{layer}.mlp.down_proj", "linear") in changed
    # HF computes the softmax in float32 whatever the input dtype: it did not change
    assert not any(op == "softmax" for _, op in changed)
    linear = next(d for d in diff.differences if d.module == "model.layers.0.self_attn.q_proj")
    assert linear.message == "linear ran in bfloat16 on actual, float32 on golden"
    assert linear.impact > 0
    # a lowered matmul outranks a lowered elementwise op: the reduction grows the error
    ranks = {(d.module, d.golden_ops[0]): i for i, d in enumerate(diff.differences)}
    mul = next(k for k in ranks if k[1] == "mul" and k in changed)
    assert ranks[("model.layers.0.self_attn", "matmul")] < ranks[mul]


def test_a_fused_rope_shows_as_many_to_one_in_each_attention(tiny_llama, input_ids, monkeypatch):
    golden = trace_graph(tiny_llama, _forward(tiny_llama, input_ids))
    with torch.no_grad():
        hand_written = tiny_llama(input_ids, use_cache=False).logits
    monkeypatch.setattr(modeling_llama, "apply_rotary_pos_emb", _fused_apply_rotary_pos_emb)
    with torch.no_grad():
        fused = tiny_llama(input_ids, use_cache=False).logits
    assert torch.allclose(fused, hand_written, rtol=1e-5, atol=1e-6)  # same math, one op
    actual = trace_graph(tiny_llama, _forward(tiny_llama, input_ids))
    diff = diff_graphs(golden, actual)
    regrouped = [d for d in diff.differences if d.kind == "regrouped"]
    assert {d.module for d in regrouped} == {f"model.layers.{i}.self_attn" for i in range(4)}
    rope = regrouped[0]
    assert rope.actual_ops == ["fused_rope"]
    # q and k: mul, neg, cat, mul, add each -> one kernel
    assert rope.golden_ops == ["mul", "neg", "cat", "mul", "add"] * 2
    assert "fused" in rope.message
    assert not [d for d in diff.differences if d.kind != "regrouped"]


@pytest.mark.slow  # torch.export's first use costs ~10 s of imports and tracing
def test_aten_level_export_and_trace_of_the_same_model_agree_on_the_layers(tiny_llama, input_ids):
    exported = exported_graph(tiny_llama, (input_ids,), {"use_cache": False})
    traced = trace_graph(tiny_llama, _forward(tiny_llama, input_ids), level="aten")
    assert exported.source == "torch.export" and exported.level == "aten"
    node = next(n for n in exported.nodes if n.module == "model.layers.0.self_attn")
    assert node.outputs[0].dtype == "float32"
    diff = diff_graphs(exported, traced)
    # the layers' ops are the same; only LlamaModel's mask code takes another path under
    # torch.export's tracing
    assert {d.module for d in diff.differences} <= {"model"}


def test_graph_diff_of_two_op_level_recordings_from_the_cli(tmp_path, capsys):
    torch.manual_seed(0)
    model = build_tiny_llama().eval()
    ids = torch.randint(0, 256, (1, 8), generator=torch.Generator().manual_seed(2))
    with torch.no_grad(), precguard.monitor(model, out=tmp_path / "fp32", level="op"):
        model(ids)
    with (
        torch.no_grad(),
        torch.autocast("cpu", dtype=torch.bfloat16),
        precguard.monitor(model, out=tmp_path / "bf16", level="op"),
    ):
        model(ids)
    graph = graph_from_run(tmp_path / "bf16")
    assert graph.source == "recording" and graph.level == "function"
    with pytest.raises(SystemExit) as info:
        main(
            [
                "graph",
                "diff",
                str(tmp_path / "fp32"),
                str(tmp_path / "bf16"),
                "--json",
                str(tmp_path / "d.json"),
                "--html",
                str(tmp_path / "d.html"),
            ]
        )
    out = capsys.readouterr().out
    assert info.value.code == 1
    assert "linear ran in bfloat16 on actual, float32 on golden" in out
    saved = json.loads((tmp_path / "d.json").read_text())
    assert saved["verdict"] == "different" and saved["differences"]
    assert "model.layers.0.self_attn.q_proj" in (tmp_path / "d.html").read_text()
    with pytest.raises(SystemExit) as info:
        main(["graph", "diff", str(tmp_path / "fp32"), str(tmp_path / "fp32")])
    assert info.value.code == 0  # nothing differs
    assert "same ops" in capsys.readouterr().out


def test_graph_export_writes_a_graph_and_refuses_what_it_cannot_do(tmp_path, capsys):
    out = tmp_path / "g.json"
    with pytest.raises(SystemExit) as info:
        main(
            [
                "graph",
                "export",
                "-t",
                "tiny-llama",
                "--level",
                "function",
                "--source",
                "trace",
                "--out",
                str(out),
            ]
        )
    assert info.value.code in (0, None)
    graph = load_graph(out)
    assert graph.level == "function" and graph.source == "op-trace"
    assert any(n.op == "softmax" for n in graph.nodes)
    capsys.readouterr()
    for args, says in [
        (["--out", str(out)], "exists"),  # never overwritten unless asked
        (["--format", "onnx", "--out", str(tmp_path / "g.onnx")], "needs the onnx package"),
        (
            ["--level", "function", "--source", "export", "--out", str(tmp_path / "x")],
            "torch.export sees aten ops only",
        ),
    ]:
        with pytest.raises(SystemExit) as info:
            main(["graph", "export", "-t", "tiny-llama", *args])
        err = capsys.readouterr().err
        assert info.value.code == 2, args
        assert says in err and "Traceback" not in err


def test_graph_diff_refuses_a_recording_without_op_records(tmp_path, capsys):
    model = torch.nn.Linear(4, 4)
    with precguard.monitor(model, out=tmp_path / "mod"):
        model(torch.randn(2, 4))
    with pytest.raises(SystemExit) as info:
        main(["graph", "diff", str(tmp_path / "mod"), str(tmp_path / "mod")])
    assert info.value.code == 2
    assert "level='op'" in capsys.readouterr().err
