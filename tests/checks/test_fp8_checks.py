"""``precguard check --checklist fp8``: each fp8 GEMM's scale against its operand.

The user's story: a model trained or served with fp8 Linear layers goes wrong
after a spike; the fp8 checklist names the GEMM whose scale no longer fits.
"""

from __future__ import annotations

from tests.checks.conftest import planted


def test_a_correct_fp8_model_passes_every_fp8_check(run_check):
    run = run_check(
        "--target", "tiny-llama", "--device", "emu:fp8-e4m3", "--checklist", "fp8",
        "--only", "fp8",
    )  # fmt: skip
    assert run.code == 0, run.out
    assert set(run.statuses("pass")) == {
        "fp8.saturation", "fp8.underflow", "fp8.stale_scale", "fp8.master_weights"
    }  # fmt: skip


def test_a_stale_amax_history_after_a_spike_is_named_at_its_gemm(run_check):
    run = run_check(
        "--target", planted("fp8_activation_spike"), "--device", "emu:fp8-e4m3-delayed",
        "--checklist", "fp8", "--only", "fp8",
    )  # fmt: skip
    assert run.code == 1
    stale = run.finding("fp8.stale_scale")
    assert stale["status"] == "fail"
    assert stale["evidence"]["worst"].startswith("model.layers.1.mlp.up_proj")
    assert "activation" in stale["evidence"]["worst"]
    # the spike is 8x: the history's amax is about 8x below the operand's own
    assert 4 < stale["evidence"]["growth"] <= 8
    assert run.finding("fp8.saturation")["status"] == "fail"


def test_the_same_spike_under_current_scaling_saturates_nothing(run_check):
    run = run_check(
        "--target", planted("fp8_activation_spike"), "--device", "emu:fp8-e4m3",
        "--checklist", "fp8", "--only", "fp8.saturation", "--only", "fp8.stale_scale",
    )  # fmt: skip
    assert run.code == 0, run.out


def test_master_weights_stored_in_fp8_are_named(run_check):
    run = run_check(
        "--target", planted("fp8_master_weights"), "--device", "emu:fp8-e4m3",
        "--checklist", "fp8", "--only", "fp8.master_weights",
    )  # fmt: skip
    found = run.finding("fp8.master_weights")
    assert found["status"] == "fail"
    assert "model.layers.0.mlp.down_proj.weight" in found["summary"]


def test_fp8_checks_skip_a_device_without_fp8_gemms(run_check):
    run = run_check(
        "--target", "tiny-llama", "--device", "emu:bf16-mixed", "--checklist", "fp8",
        "--only", "fp8.saturation",
    )  # fmt: skip
    assert run.finding("fp8.saturation")["status"] == "skip"


# -- real float8 tensors: on any device, the tensors the model's modules receive and hold ---
def test_a_float8_weight_scaled_from_its_own_amax_passes_on_a_plain_device(run_check):
    run = run_check(
        "--target", planted("fp8_scaled_weight"), "--device", "cpu", "--checklist", "fp8",
        "--only", "fp8",
    )  # fmt: skip
    assert run.code == 0, run.out
    saturation = run.finding("fp8.saturation")
    assert saturation["status"] == "pass"
    # the weight's ±max share (what rounding carried there) is read, and within its allowance
    assert 0 < saturation["evidence"]["saturated_share"] <= saturation["evidence"]["allowed_share"]
    assert saturation["evidence"]["worst"].startswith("model.2 ")
    assert run.finding("fp8.master_weights")["status"] == "pass"  # frozen: served weights


def test_a_float8_weight_quantized_with_a_stale_scale_is_named_at_its_module(run_check):
    run = run_check(
        "--target", planted("fp8_stale_weight_scale"), "--device", "cpu",
        "--checklist", "fp8", "--only", "fp8",
    )  # fmt: skip
    assert run.code == 1
    saturation = run.finding("fp8.saturation")
    assert saturation["status"] == "fail"
    assert saturation["evidence"]["worst"] == "model.2 (call 0, its weight (parameter))"
    # a scale for half the amax clips every weight above half of it: about half of them
    assert 0.3 < saturation["evidence"]["saturated_share"] < 0.7


def test_a_trainable_float8_parameter_is_named_as_master_weights_in_fp8(run_check):
    run = run_check(
        "--target", planted("fp8_trainable_weight"), "--device", "cpu", "--checklist", "fp8",
        "--only", "fp8.master_weights",
    )  # fmt: skip
    found = run.finding("fp8.master_weights")
    assert found["status"] == "fail"
    assert "2.weight: float8_e4m3fn" in found["summary"]
