"""``norm.extreme_inputs`` fails a norm whose statistics are off, however ill-conditioned the row.

The story: LayerNorm's mean and variance computed one-pass in bf16 (``E[x^2] -
E[x]^2``). On rows whose mean dwarfs their spread the variance cancels and the
output is ~90x larger than any normalization can give; the check's conditioning
allowance (a correct norm rounds the mean) must not excuse that.
"""

from __future__ import annotations

from pathlib import Path

import torch

from precguard.checks.norm import output_bound

PARALLEL = Path(__file__).with_name("parallel.py")


def test_the_bound_is_the_largest_gain_plus_bias_measured_on_the_module():
    ln = torch.nn.LayerNorm(8)
    with torch.no_grad():
        ln.weight.copy_(torch.linspace(0.5, 2.0, 8))
        ln.bias.fill_(0.25)
    bound = output_bound(ln, torch.zeros(2, 3, 8))
    assert abs(bound - 2.25) < 1e-4
    # no rows of mean 0 and RMS 1 with +-1 entries on an odd width: not measured
    assert output_bound(torch.nn.LayerNorm(7), torch.zeros(2, 7)) is None


def test_one_pass_bf16_layernorm_fails_and_its_twin_passes(run_check):
    bug = run_check(
        "--target", f"{PARALLEL}:norm_low_precision", "--device", "emu:bf16", "--only", "norm"
    )
    found = bug.finding("norm.extreme_inputs")
    assert found["status"] == "fail", found
    assert "beyond the" in found["summary"] and "any normalization gives" in found["summary"]
    module = found["evidence"]["modules"]["transformer.h.0.ln_attn"]
    assert module["mean_offset_output_rms"] > 10 * module["output_rms_bound"]
    # a LayerNorm's remedy centres first (two passes), not an RMSNorm's rsqrt(mean(x^2))
    assert "two passes" in found["remedy"] and "E[x^2] - E[x]^2" in found["remedy"]
    assert bug.code == 1

    twin = run_check("--target", f"{PARALLEL}:correct", "--device", "emu:bf16", "--only", "norm")
    assert twin.finding("norm.extreme_inputs")["status"] == "pass"
    assert twin.code == 0
