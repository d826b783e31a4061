"""A correct bf16 fine-tune matches; its optimizer steps are judged through the update rule.

The story: a user fine-tunes a LoRA adapter (PEFT) on a tiny LLaMA with AdamW, once
in fp32 on the CPU (golden) and once in bf16, and compares the two. AdamW's first
step from ``B = 0`` is about ``lr * sign(grad)``; bf16 flips the sign of a few
near-zero gradient elements, so the adapter's weights after the step differ by
10-20 % while every gradient is within bf16's error. That is a correct run, and
compare must say MATCH; a 3 % fault planted in one ``lora_B`` must still be named.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import precguard
from precguard import Record, Stats, TensorRef
from precguard.cli import main
from precguard.compare import compare_recordings
from precguard.targets import build_tiny_llama, causal_lm_loss, lm_batch

pytest.importorskip("peft")

FAULTY = "base_model.model.model.layers.1.self_attn.v_proj.lora_B.default"


def lora_llama() -> torch.nn.Module:
    from peft import LoraConfig, get_peft_model

    model = build_tiny_llama(num_hidden_layers=2)
    config = LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"], lora_dropout=0.0)
    return get_peft_model(model, config)


def lora_target() -> precguard.Target:
    return precguard.Target(
        model=lora_llama,
        batch=lambda step: lm_batch(step, batch=2, seq=32),
        loss=causal_lm_loss,
        optimizer=lambda ps: torch.optim.AdamW([p for p in ps if p.requires_grad], lr=1e-3),
        seed=0,
        name="tiny-llama-lora",
    )


def scale_lora_b(model: torch.nn.Module) -> None:
    """The planted fault: one adapter's output 3 % too large on the actual side."""
    dict(model.named_modules())[FAULTY].register_forward_hook(lambda _m, _a, out: out * 1.03)


def record(out: Path, device: str, *, tensors: bool, fault: bool = False) -> Path:
    return precguard.record_target(
        lora_target(),
        device=device,
        out=out,
        steps=2,
        train=True,
        tensors=tensors,
        prepare=scale_lora_b if fault else None,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("lora")
    return {
        "golden": record(root / "g", "cpu", tensors=False),
        "bf16": record(root / "a", "emu:bf16", tensors=False),
        "golden_full": record(root / "gf", "cpu", tensors=True),
        "bf16_full": record(root / "af", "emu:bf16", tensors=True),
        "fault_full": record(root / "ff", "emu:bf16", tensors=True, fault=True),
    }


def test_a_correct_bf16_lora_fine_tune_matches_on_statistics(runs: dict[str, Path]) -> None:
    result = compare_recordings(runs["golden"], runs["bf16"])
    assert result.verdict == "match", result.first_divergence
    # the adapter's weights after the first AdamW step did differ: the rule explained it
    after = [
        r
        for r in result.records
        if r.step == 1 and r.key.endswith("lora_B.default.0.forward.param.0") and r.metrics
    ]
    assert after and all(r.expected_error and r.expected_error > 0.05 for r in after)


def test_a_correct_bf16_lora_fine_tune_matches_on_full_tensors(runs: dict[str, Path]) -> None:
    result = compare_recordings(runs["golden_full"], runs["bf16_full"])
    assert result.verdict == "match", result.first_divergence
    flipped = [
        r.metrics.error
        for r in result.records
        if r.step == 1 and r.key.endswith("lora_B.default.0.forward.param.0") and r.metrics
    ]
    assert max(flipped) > 0.05  # sign flips happened, and were judged correct


def test_a_three_percent_fault_in_one_lora_b_is_named(runs: dict[str, Path]) -> None:
    result = compare_recordings(runs["golden_full"], runs["fault_full"])
    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    assert result.first_divergence.module == FAULTY


def watched(out: Path, *, bf16: bool, lr_scale: float = 1.0) -> Path:
    """A hand-written LoRA loop under precguard.watch, every second step recorded."""
    torch.manual_seed(0)
    model = lora_llama()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3 * lr_scale)
    with precguard.watch(model, opt, every=2, out=out) as w:
        for step in range(5):
            batch = lm_batch(step, batch=2, seq=32)
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                loss = causal_lm_loss(model(batch["input_ids"]), batch)
            loss.backward()
            opt.step()
            opt.zero_grad()
            w.step(loss)
    return out / "recording"


@pytest.fixture(scope="module")
def watches(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("watch")
    return {
        "golden": watched(root / "g", bf16=False),
        "bf16": watched(root / "a", bf16=True),
        "lr": watched(root / "lr", bf16=True, lr_scale=1.5),
    }


def test_the_watch_of_a_bf16_loop_matches_and_covers_its_sampled_steps(
    watches: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    result = compare_recordings(watches["golden"], watches["bf16"])
    assert result.verdict == "match", result.first_divergence
    updates = [r for r in result.records if ".backward.param." in r.key and r.metrics]
    assert updates and max(r.metrics.error for r in updates if r.metrics) > 0.05
    cov = result.coverage
    assert cov is not None and cov.complete, cov
    assert (cov.steps_compared, cov.golden_steps, cov.actual_steps) == (3, 3, 3)
    with pytest.raises(SystemExit) as info:
        main(["compare", str(watches["golden"]), str(watches["bf16"])])
    out = capsys.readouterr().out
    assert info.value.code == 0, out
    assert "not compared" not in out


def test_a_wrong_learning_rate_is_named_as_an_update(watches: dict[str, Path]) -> None:
    result = compare_recordings(watches["golden"], watches["lr"])
    assert result.verdict == "diverged"
    first = result.first_divergence
    assert first is not None and first.phase == "backward" and first.role == "param"
    assert "update" in first.reason and "gradients it computed" not in first.reason


def _record(key: str, t: torch.Tensor, name: str, phase: str, role: str) -> Record:
    n = t.numel()
    stats = Stats(
        min=float(t.min()),
        max=float(t.max()),
        mean=float(t.mean()),
        std=float(t.std()),
        absmax=float(t.abs().max()),
        l2=float(t.norm()),
        nan=0,
        inf=0,
        zeros=int((t == 0).sum()),
        numel=n,
    )
    return Record(
        key=key,
        module="m",
        module_type="Linear",
        call=0,
        phase=phase,
        role=role,
        index=0,
        name=name,
        step=0,
        rank=0,
        seq=0,
        dtype="float32",
        shape=list(t.shape),
        stats=stats,
        tensor=TensorRef(file="t.safetensors", name=key),
    )


def test_the_update_rule_explains_sign_flips_near_zero_but_not_elsewhere() -> None:
    from precguard.compare.optimizer import explain_update, update_allowance

    gen = torch.Generator().manual_seed(0)
    g = torch.randn(4096, generator=gen)
    noise = 0.01 * torch.randn(4096, generator=gen)
    a = g + noise  # a gradient within rounding: some near-zero elements flip sign
    lr = 1e-3
    ug, ua = -lr * torch.sign(g), -lr * torch.sign(a)  # Adam's first step
    tensors = {"g": g, "a": a, "ug": ug, "ua": ua}

    def lookup(rec: Record) -> torch.Tensor:
        return tensors[rec.key]

    grad_err = float(noise.norm() / g.norm())
    recs = {k: _record(k, v, "weight", "backward", "grad") for k, v in tensors.items()}
    upd = {
        k: _record(k, tensors[k], "optimizer.update.weight", "backward", "param")
        for k in ("ug", "ua")
    }
    ex = explain_update(upd["ug"], upd["ua"], recs["g"], recs["a"], grad_err, lookup, lookup)
    measured = float((ua - ug).norm() / ug.norm())
    assert measured > 0.05  # sign flips: far beyond the gradient's 1 %
    # every flipped element explained, and not much more (elements near zero that did
    # not flip may have moved, to first order, by their gradient's relative error)
    assert measured <= ex.flipped < 3 * measured
    assert measured <= update_allowance(ex, 2.0**-24, 10.0)[0]
    assert 0 < ex.share < 0.02

    # the same gradient error, but the update moved elements far from zero: not explained
    wrong = ug.clone()
    wrong[g.abs() > 1.0] *= -1
    tensors["ua"] = wrong
    ex = explain_update(upd["ug"], upd["ua"], recs["g"], recs["a"], grad_err, lookup, lookup)
    assert float((wrong - ug).norm() / ug.norm()) > update_allowance(ex, ex.rest, 10.0)[0]
