"""The watch: a clean run stays quiet; a planted fault alerts at its step, naming the layer."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

import precguard
from precguard import load_run
from tests.watch.conftest import TinyNet, batch, train


def _watch(out: Path | None = None, **options):
    return lambda model, opt: precguard.watch(model, opt, out=out, **options)


def test_a_clean_run_raises_no_alert() -> None:
    _model, w = train(30, _watch())
    assert w.alerts == []


def test_a_learning_rate_spike_alerts_at_its_step_naming_the_layers_whose_updates_jumped(
    tmp_path: Path,
) -> None:
    spike_step = 20

    def spike(step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        # the second param group holds exactly the `hidden` layer's parameters
        opt.param_groups[1]["lr"] = 3e-2 if step == spike_step else 1e-3

    _model, w = train(30, _watch(tmp_path / "w"), before_step=spike)

    jumps = [a for a in w.alerts if a.kind == "update_ratio_jump"]
    assert [a.step for a in jumps] == [spike_step]
    assert {e.layer for e in jumps[0].layers} == {"hidden.weight", "hidden.bias"}
    assert {e.module for e in jumps[0].layers} == {"hidden"}
    # 30x the learning rate: Adam's update, and so the ratio, is ~30x its median
    for e in jumps[0].layers:
        assert 10 < e.value / e.median < 60
    # the alert is in alerts.jsonl, as the log said
    lines = [json.loads(x) for x in (tmp_path / "w" / "alerts.jsonl").read_text().splitlines()]
    assert [(x["kind"], x["step"]) for x in lines] == [("update_ratio_jump", spike_step)]


def test_a_nan_in_one_layers_gradient_alerts_at_its_step_with_that_layer(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    bad_step = 12
    current = {"step": 0}

    def poison(grad: torch.Tensor) -> torch.Tensor:
        # a backward that produces one NaN in the `out` layer's weight gradient at bad_step
        if current["step"] != bad_step:
            return grad
        grad = grad.clone()
        grad[1, 3] = math.nan
        return grad

    model.out.weight.register_hook(poison)
    with precguard.watch(model, opt, out=tmp_path / "w") as w:
        for step in range(16):
            current["step"] = step
            x, y = batch(step)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss)

    nonfinite = [a for a in w.alerts if a.kind == "nonfinite"]
    assert len(nonfinite) == 1  # the first one; the NaN spreads after it, unannounced
    assert nonfinite[0].step == bad_step
    assert [e.layer for e in nonfinite[0].layers] == ["out.weight"]
    assert math.isnan(nonfinite[0].layers[0].value)
    assert "out.weight" in nonfinite[0].message
    scalars = [json.loads(x) for x in (tmp_path / "w" / "scalars.jsonl").read_text().splitlines()]
    assert next(s["step"] for s in scalars if s["nonfinite"]) == bad_step


def test_on_alert_record_records_the_next_step_in_full_for_compare_and_replay(
    tmp_path: Path,
) -> None:
    def spike(step: int, model: nn.Module, opt: torch.optim.Optimizer) -> None:
        opt.param_groups[1]["lr"] = 3e-2 if step == 20 else 1e-3

    _model, w = train(24, _watch(tmp_path / "w", every=1000, on_alert="record"), before_step=spike)
    [alert] = w.alerts
    assert alert.recorded_step == 21
    run = load_run(w.recording_path)
    assert run.manifest.complete
    records = list(run.records())
    assert sorted({r.step for r in records}) == [0, 21]  # step 0 (every N-th) and after the alert
    after = [r for r in records if r.step == 21]
    # activations, gradients and parameters, with full tensors
    assert {(r.phase, r.role) for r in after} >= {
        ("forward", "input"),
        ("forward", "output"),
        ("forward", "param"),
        ("backward", "grad"),
    }
    out_record = next(r for r in after if r.key == "hidden.0.forward.output.0")
    assert out_record.tensor is not None
    assert run.tensor(out_record).shape == (8, 32)
    # step 0 is statistics only
    assert all(r.tensor is None for r in records if r.step == 0)


def test_recorded_steps_hold_the_optimizer_state_and_the_exact_update(tmp_path: Path) -> None:
    _model, w = train(5, _watch(tmp_path / "w", every=2))
    records = list(load_run(w.recording_path).records())
    assert sorted({r.step for r in records}) == [0, 2, 4]
    by_name = {(r.step, r.module, r.name): r for r in records if r.phase == "backward"}
    update = by_name[(4, "hidden", "optimizer.update.weight")]
    assert by_name[(4, "hidden", "optimizer.exp_avg.weight")].shape == [32, 32]
    assert by_name[(4, "hidden", "optimizer.exp_avg_sq.weight")].stats.min >= 0
    # AdamW's first steps move every element by about lr: the update's absmax is ~1e-3
    assert 2e-4 < update.stats.absmax < 3e-3
    param = next(r for r in records if r.step == 4 and r.key == "hidden.0.forward.param.0")
    ratio = update.stats.l2 / param.stats.l2
    layers = [json.loads(x) for x in (tmp_path / "w" / "layers.jsonl").read_text().splitlines()]
    index = w.pulse.names.index("hidden.weight")
    sampled = layers[4]["update_ratio"][index]
    # the per-step estimate from 256 sampled elements is close to the exact ratio
    assert abs(sampled - ratio) / ratio < 0.25


def test_between_recorded_steps_no_module_hook_runs(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = TinyNet()
    plain = TinyNet()
    plain.load_state_dict(model.state_dict())
    x, _y = batch(0)
    with precguard.watch(model, None, every=1000, out=tmp_path / "w") as w:
        w.step(torch.tensor(0.0))  # step 0 was recorded; step 1 is not
        assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.children())
        # and the watched model computes exactly what the plain one does
        assert torch.equal(model(x), plain(x))
    assert not model._forward_hooks
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


def test_an_unknown_option_is_an_error_and_a_used_directory_is_refused(tmp_path: Path) -> None:
    import pytest
    from pydantic import ValidationError

    from precguard import OutputExistsError

    model = TinyNet()
    with pytest.raises(ValidationError, match="z_treshold"):
        precguard.watch(model, z_treshold=3)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(OutputExistsError):
        precguard.watch(model, out=tmp_path)
    with pytest.raises(OutputExistsError, match="not a precguard watch"):
        precguard.watch(model, out=tmp_path, overwrite=True)
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert not any(p._post_accumulate_grad_hooks for p in model.parameters())


def test_precguard_watch_stays_the_function_whatever_was_imported_first() -> None:
    # a submodule import must not shadow the function
    import precguard.training.hf
    import precguard.training.report

    assert callable(precguard.watch)
    assert precguard.watch is precguard.training.handle.watch
