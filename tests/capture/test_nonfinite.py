"""NaN/Inf origin: the first module whose output is non-finite while its inputs were finite."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import precguard
from precguard import NonFiniteError
from tests.capture.models import Stack


def plant_nan(model: torch.nn.Module, module_name: str) -> None:
    """Make ``module_name`` output NaN in its first element (its inputs stay finite)."""
    module = model.get_submodule(module_name)

    def poison(_mod, _args, output):
        out = output.clone()
        out.view(-1)[0] = float("nan")
        return out

    module.register_forward_hook(poison)


@pytest.fixture
def poisoned_llama(tiny_llama):
    plant_nan(tiny_llama, "model.layers.2.mlp.down_proj")
    return tiny_llama


def test_origin_recorded_and_logged(poisoned_llama, input_ids, tmp_path, caplog):
    with (
        caplog.at_level("WARNING", logger="precguard"),
        torch.no_grad(),
        precguard.monitor(poisoned_llama, out=tmp_path / "run"),
    ):
        poisoned_llama(input_ids)
    records = list(precguard.load_run(tmp_path / "run").records())
    origins = [r for r in records if r.nonfinite_origin]
    assert [r.module for r in origins] == ["model.layers.2.mlp.down_proj"]
    assert origins[0].stats.nan == 1
    # downstream modules are non-finite too, but are not origins
    downstream = [r for r in records if r.role == "output" and r.stats and r.stats.nan]
    assert len(downstream) > 3
    assert downstream[0].module == "model.layers.2.mlp.down_proj"
    events = [r for r in caplog.records if getattr(r, "precguard_event", "") == "nonfinite_origin"]
    assert [e.precguard_data["module"] for e in events] == ["model.layers.2.mlp.down_proj"]


def test_raise_names_origin(poisoned_llama, input_ids, tmp_path):
    with (
        pytest.raises(NonFiniteError, match=r"model\.layers\.2\.mlp\.down_proj") as info,
        torch.no_grad(),
        precguard.monitor(poisoned_llama, out=tmp_path / "run", on_nonfinite="raise"),
    ):
        poisoned_llama(input_ids)
    assert info.value.module == "model.layers.2.mlp.down_proj"
    assert info.value.step == 0


def test_save_writes_origin_inputs_and_note(poisoned_llama, input_ids, tmp_path):
    with (
        torch.no_grad(),
        precguard.monitor(poisoned_llama, out=tmp_path / "run", on_nonfinite="save"),
    ):
        poisoned_llama(input_ids)
    folders = list((tmp_path / "run" / "rank0").glob("nonfinite-*"))
    assert len(folders) == 1
    note = json.loads((folders[0] / "note.json").read_text())
    assert note["module"] == "model.layers.2.mlp.down_proj"
    assert note["step"] == 0 and note["rank"] == 0
    assert any("test_nonfinite.py" in frame for frame in note["stack"])
    saved = load_file(str(folders[0] / "inputs.safetensors"))
    assert list(saved) == ["args.0"]
    assert torch.isfinite(saved["args.0"]).all()


def test_origin_in_hand_written_stack(tmp_path):
    torch.manual_seed(0)
    model = Stack()
    model.poison_block = 1  # NaN is made inside root.forward after blocks.1
    with torch.no_grad(), precguard.monitor(model, out=tmp_path / "run"):
        model(torch.randn(2, 8))
    origins = [r for r in precguard.load_run(tmp_path / "run").records() if r.nonfinite_origin]
    # blocks.2's *input* is already NaN, so it only passes NaN on: the origin is the
    # module whose own computation produced it — here the root, which divided by zero.
    assert [r.module for r in origins] == ["root"]


def test_inf_counted(tmp_path):
    model = torch.nn.Linear(2, 2)
    with torch.no_grad():
        model.weight.fill_(1e38)
        model.bias.zero_()
        with precguard.monitor(model, out=tmp_path / "run"):
            model(torch.full((1, 2), 10.0))
    rec = next(r for r in precguard.load_run(tmp_path / "run").records() if r.role == "output")
    assert rec.stats.inf == 2 and rec.stats.nan == 0
    assert rec.nonfinite_origin
    assert rec.stats.max == float("inf")


def test_generate_diffs_replay_keeps_the_origin_as_a_debug_event_not_a_stray_line(
    poisoned_llama, input_ids, tmp_path, caplog
):
    """generate-diff's replay records the origin; the terminal gets no warning line (issue 39)."""
    from precguard.generation.layerwise import origin_events_at_debug

    ORIGIN = "nonfinite_origin"

    def replay(out: str) -> list:
        caplog.clear()
        with (
            torch.no_grad(),
            origin_events_at_debug(),
            precguard.monitor(poisoned_llama, out=tmp_path / out),
        ):
            poisoned_llama(input_ids)
        return [
            r for r in caplog.records if getattr(r, "precguard_event", "") == "nonfinite_origin"
        ]

    with caplog.at_level("WARNING", logger="precguard"):
        assert replay("quiet") == []
    origins = [r for r in precguard.load_run(tmp_path / "quiet").records() if r.nonfinite_origin]
    assert [r.module for r in origins] == ["model.layers.2.mlp.down_proj"]  # still marked
    with caplog.at_level("DEBUG", logger="precguard"):
        events = replay("debug")
    assert [(e.levelname, e.precguard_data["module"]) for e in events] == [
        ("DEBUG", "model.layers.2.mlp.down_proj")
    ]
    # outside the replay the capture warns as before
    with (
        caplog.at_level("WARNING", logger="precguard"),
        torch.no_grad(),
        precguard.monitor(poisoned_llama, out=tmp_path / "loud"),
    ):
        poisoned_llama(input_ids)
    assert any(getattr(r, "precguard_event", "") == ORIGIN for r in caplog.records)
