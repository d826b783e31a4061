"""A wrapped run (DDP) and a renamed model compare cleanly with their golden."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

import precguard
from precguard import UsageError
from precguard.compare.align import Renamer, RenameRule, closest_unmatched
from precguard.targets import build_tiny_llama, causal_lm_loss, lm_batch
from tests.compare.conftest import run_cli


def _train_step(model: nn.Module, out: Path) -> None:
    batch = lm_batch(0)
    with precguard.monitor(model, out=out, tensors=True):
        causal_lm_loss(model(**batch), batch).backward()


def test_ddp_wrapped_run_compares_cleanly_with_single_process_golden(tmp_path: Path) -> None:
    torch.manual_seed(0)
    _train_step(build_tiny_llama(), tmp_path / "golden")

    dist.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        torch.manual_seed(0)
        ddp = nn.parallel.DistributedDataParallel(build_tiny_llama())
        _train_step(ddp, tmp_path / "ddp")
    finally:
        dist.destroy_process_group()
    keys = {r.key for r in precguard.load_run(tmp_path / "ddp").records()}
    assert "module.model.layers.0.mlp.0.forward.output.0" in keys  # really wrapped

    result = precguard.compare_runs(tmp_path / "golden", tmp_path / "ddp")

    assert result.verdict == "match", [r.key for r in result.records if r.status != "pass"]
    assert result.counts.missing == 0 and not result.unmatched.actual_only
    assert result.counts.full > 100  # compared tensors, forward and backward
    assert any(r.key == "model.layers.0.mlp.0.backward.input.0" for r in result.records)
    assert any(r.key == "root.0.forward.output.0" for r in result.records)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(32, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


class Net(nn.Module):
    """The same network; version 2 calls its blocks 'layers' instead of 'blocks'."""

    def __init__(self, blocks: str) -> None:
        super().__init__()
        self.embed = nn.Linear(8, 16)
        self.blocks_name = blocks
        setattr(self, blocks, nn.ModuleList([Block() for _ in range(2)]))
        self.head = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x)
        for block in getattr(self, self.blocks_name):
            h = block(h)
        return self.head(h)


def _record_net(blocks: str, out: Path) -> Path:
    torch.manual_seed(0)
    model = Net(blocks)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), precguard.monitor(model, out=out, tensors=True):
        model(x)
    return out


def test_renamed_model_compares_cleanly_with_map(tmp_path: Path, capsys) -> None:
    old = _record_net("blocks", tmp_path / "v1")
    new = _record_net("layers", tmp_path / "v2")

    code, _, err = run_cli(["compare", str(old), str(new)], capsys)
    assert code == 2
    line = err.strip()
    assert "\n" not in line
    assert "blocks.0.fc1 ~ layers.0.fc1" in line
    assert "--map 'blocks.*=layers.*'" in line

    report = tmp_path / "cmp.json"
    args = ["compare", str(old), str(new), "--map", "blocks.*=layers.*", "--json", str(report)]
    code, out, err = run_cli(args, capsys)
    assert code == 0, out + err
    data = json.loads(report.read_text())
    assert data["verdict"] == "match"
    assert data["counts"]["missing"] == 0 and data["counts"]["full"] > 20
    assert any(r["key"] == "layers.1.fc2.0.forward.output.0" for r in data["records"])


def test_rename_rules() -> None:
    assert RenameRule.parse("blocks.*=layers.*").apply("blocks.3.fc") == "layers.3.fc"
    assert RenameRule.parse("transformer=model").apply("transformer.h.0") == "model.h.0"
    assert RenameRule.parse("transformer=model").apply("transformers.h") is None
    assert RenameRule.parse("*.c_fc=*.up_proj").apply("h.0.mlp.c_fc") == "h.0.mlp.up_proj"
    for bad in ("blocks", "=x", "a=", "a=*"):
        with pytest.raises(UsageError, match="--map"):
            RenameRule.parse(bad)
    # rules see the names with wrappers stripped; the first matching rule wins
    r = Renamer.from_strings(["a.*=b.*", "a.x=c.x"])
    assert r.name("_orig_mod.a.x") == "b.x"
    assert r.name("module.a.y", root_wrapped=True) == "b.y"
    assert r.name("layers.0._checkpoint_wrapped_module.mlp") == "layers.0.mlp"
    assert r.name("module.a") == "module.a"  # a submodule that is really named 'module'


def test_closest_unmatched_names_without_a_close_one() -> None:
    assert closest_unmatched([], ["x.0.forward.output.0"]) == ""
    text = closest_unmatched(["alpha.0.forward.output.0"], ["zzz.0.forward.output.0"])
    assert "golden-only modules: alpha" in text and "actual-only: zzz" in text
