"""Checks share the runs they need (issue 41): counted in forward passes, never in seconds."""

from __future__ import annotations

import precguard


def test_the_gradient_checks_share_one_backward_per_side(forward_passes):
    # the reference's backward and the device's unscaled one, watched for NaN/Inf once:
    # loss scaling, the first-batch comparison and the NaN origin all read them
    d = precguard.check(
        "llama-finetune",
        "tiny-llama",
        device="emu:fp16",
        only=["amp.loss_scaling", "grads.nonfinite_origin", "grads.first_batch"],
    )
    found = {f.id: f for f in d.findings}
    assert found["grads.nonfinite_origin"].status == "fail"  # fp16 overflows its backward
    assert "born in the backward" in found["grads.nonfinite_origin"].summary
    assert found["amp.loss_scaling"].status == "warn"  # NaN before scaling: judged upstream
    assert forward_passes("LlamaForCausalLM") == 2


def test_a_gap_within_the_compute_dtypes_precision_needs_no_shuffled_run(forward_passes):
    # bf16 storage rounds reordering away: the gap to fp32 is judged by bf16's eps, which
    # decides the verdict before any shuffled forward would
    d = precguard.check("llama-finetune", "tiny-llama", device="emu:bf16", only=["reduce"])
    (found,) = d.findings
    assert found.status == "pass" and "no shuffled run needed" in found.summary
    assert forward_passes("LlamaForCausalLM") == 2  # the plain forward of each side


def test_order_noise_stops_once_it_covers_the_gap(forward_passes):
    # an fp32 device that only reorders its sums: the first shuffled run already shows
    # noise as large as the gap, and more runs could only make it larger
    d = precguard.check("llama-finetune", "tiny-llama", device="emu:fp32-shuffled", only=["reduce"])
    (found,) = d.findings
    assert found.status == "pass" and "order noise" in found.summary
    assert len(found.evidence["per_run"]) == 1  # gap/noise ~1, well within the factor 4
    assert forward_passes("LlamaForCausalLM") == 3  # each side's plain forward, one shuffled
