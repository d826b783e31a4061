"""A loop that clips hands its gradient norm to the watch, which then reads no gradient itself."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

import precguard
from tests.watch.conftest import TinyNet, batch


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def _run(
    out: Path,
    steps: int,
    *,
    norm: str,
    every: int = 1000,
    poison_step: int | None = None,
    given_steps: range | None = None,
    poison: tuple[str, tuple[int, int]] = ("out", (1, 3)),
) -> tuple[nn.Module, precguard.training.WatchHandle, list[float]]:
    """Train TinyNet; ``norm``: "clip" (clip to 1, pass the norm), "measure" (pass the
    unclipped total norm), "none" (pass nothing: the watch's hooks take it)."""
    torch.manual_seed(0)
    model = TinyNet()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    current = {"step": 0}

    layer, where = poison

    def plant(grad: torch.Tensor) -> torch.Tensor:
        if current["step"] != poison_step:
            return grad
        grad = grad.clone()
        grad[where] = math.nan
        return grad

    getattr(model, layer).weight.register_hook(plant)
    norms: list[float] = []
    with precguard.watch(model, opt, every=every, out=out) as w:
        for step in range(steps):
            current["step"] = step
            x, y = batch(step)
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            grads = [p.grad for p in model.parameters()]
            if norm == "clip":
                total = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            else:
                total = torch.nn.utils.get_total_norm(grads)
            norms.append(float(total))
            opt.step()
            opt.zero_grad()
            give = norm != "none" and (given_steps is None or step in given_steps)
            w.step(loss, grad_norm=total if give else None)
    return model, w, norms


def test_the_loops_clip_norm_is_the_watchs_and_its_own_pass_runs_only_on_recorded_steps(
    tmp_path: Path,
) -> None:
    _model, w, norms = _run(tmp_path / "w", 12, norm="clip", every=5)
    scalars = _lines(tmp_path / "w" / "scalars.jsonl")
    # the global norm is exactly what clip_grad_norm_ returned (before clipping)
    assert [s["grad_norm"] for s in scalars] == norms
    layers = _lines(tmp_path / "w" / "layers.jsonl")
    with_layer_norms = [x["step"] for x in layers if all(g is not None for g in x["grad_norm"])]
    without = [x["step"] for x in layers if all(g is None for g in x["grad_norm"])]
    # step 0 runs the hooks (nothing handed over yet), then only the recorded steps 5, 10
    assert with_layer_norms == [0, 5, 10]
    assert without == [s for s in range(12) if s not in (0, 5, 10)]
    assert w.alerts == []


def test_a_handed_over_norm_is_the_norm_the_hooks_would_have_taken(tmp_path: Path) -> None:
    _run(tmp_path / "given", 8, norm="measure")
    _run(tmp_path / "hooks", 8, norm="none")
    a = _lines(tmp_path / "given" / "scalars.jsonl")
    b = _lines(tmp_path / "hooks" / "scalars.jsonl")
    # the watch changes nothing the model computes: the losses are bitwise equal
    assert [s["loss"] for s in a] == [s["loss"] for s in b]
    for s, t in zip(a, b, strict=True):
        # the same sum of squares of ~1.4k float32 elements, summed in another order
        assert math.isclose(s["grad_norm"], t["grad_norm"], rel_tol=1e-5)


def test_a_nan_under_a_handed_over_norm_alerts_at_its_step_naming_the_layer(
    tmp_path: Path,
) -> None:
    # no clipping: AdamW carries the NaN into that one element of hidden.weight only;
    # element 0 is not among the 256 the update ratio samples (every 4th from 2), so
    # the watch finds the layer by looking at the parameters
    _model, w, _n = _run(
        tmp_path / "w", 16, norm="measure", poison_step=12, poison=("hidden", (0, 0))
    )
    [alert] = [a for a in w.alerts if a.kind == "nonfinite"]
    assert alert.step == 12
    assert [e.layer for e in alert.layers] == ["hidden.weight"]
    assert "global gradient norm is nan" in alert.message
    assert "hidden.weight are non-finite after the update" in alert.message


def test_a_nan_under_clipping_reaches_every_layer_and_the_alert_says_so(tmp_path: Path) -> None:
    # clip_grad_norm_ scales every gradient by max_norm / NaN: every parameter goes NaN
    model, w, _n = _run(tmp_path / "w", 14, norm="clip", poison_step=12)
    [alert] = [a for a in w.alerts if a.kind == "nonfinite"]
    assert alert.step == 12
    assert [e.layer for e in alert.layers] == [n for n, _p in model.named_parameters()]


def test_a_loop_that_stops_handing_over_its_norm_gets_the_hooks_back(tmp_path: Path) -> None:
    _model, _w, norms = _run(tmp_path / "w", 8, norm="measure", given_steps=range(4))
    scalars = _lines(tmp_path / "w" / "scalars.jsonl")
    layers = _lines(tmp_path / "w" / "layers.jsonl")
    have = [x["step"] for x in layers if all(g is not None for g in x["grad_norm"])]
    # steps 1-4 ran without the hooks (step 3 handed a norm over, step 4 did not)
    assert have == [0, 5, 6, 7]
    # step 4 had neither: no global norm rather than a wrong one
    assert [s["grad_norm"] is None for s in scalars] == [s == 4 for s in range(8)]
    for s in (0, 1, 2, 3, 5, 6, 7):
        assert math.isclose(scalars[s]["grad_norm"], norms[s], rel_tol=1e-5)


def test_the_update_ratio_sample_reads_the_same_spread_elements_of_every_layout() -> None:
    from precguard.training.pulse import SAMPLE, Pulse

    storage = torch.randn(5000)
    model = nn.Module()
    model.wide = nn.Parameter(torch.randn(300, 7))
    model.transposed = nn.Parameter(torch.randn(7, 300).t())  # not contiguous
    model.offset = nn.Parameter(storage[1000:3000].view(40, 50))  # starts inside a storage
    model.small = nn.Parameter(torch.randn(30))  # fewer elements than the sample
    pulse = Pulse(model)
    try:
        rows = pulse._sample()
        for row, (_name, p) in zip(rows, pulse.params, strict=True):
            n = p.numel()
            where = (torch.arange(SAMPLE) * max(n // SAMPLE, 1) + n // (2 * SAMPLE)) % n
            assert torch.equal(row, p.detach().reshape(-1)[where])
    finally:
        pulse.remove()
