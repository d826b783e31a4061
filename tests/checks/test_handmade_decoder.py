"""Checks on a decoder written by hand: they test the real function, and pass correct code.

The story: a user ports their own decoder (custom RMSNorm, RoPE as functions,
own attention, a tensor batch) and runs ``precguard check``. Correct code must
come out clean on ``cpu``; each planted bug must be found in its own family,
however the code hides it (an explicit cast, a function instead of a module).
"""

from __future__ import annotations

import pytest


def handmade(name: str) -> str:
    from pathlib import Path

    return f"{Path(__file__).with_name('handmade.py')}:{name}"


def test_correct_handwritten_decoder_has_no_failure_on_cpu(run_check):
    run = run_check("--checklist", "llama-finetune", "--target", handmade("clean"))
    assert run.statuses("fail") == [] and run.statuses("error") == [], run.out
    assert run.code == 0
    norm = run.finding("norm.extreme_inputs")
    assert norm["status"] == "pass"
    assert {m["type"] for m in norm["evidence"]["modules"].values()} == {"RMSNorm"}
    assert run.finding("rope.position_sweep")["status"] == "pass"
    # a pass (or skip) has nothing to fix: no remedy on those rows
    quiet = [f for f in run.diagnosis["findings"] if f["status"] in ("pass", "skip")]
    assert quiet and all(f["remedy"] == "" for f in quiet)


def test_a_norm_that_squares_in_fp16_inside_an_fp32_model_fails(run_check):
    run = run_check("--target", handmade("norm_squares_fp16"), "--only", "norm")
    found = run.finding("norm.extreme_inputs")
    assert found["status"] == "fail", found
    assert "blocks.0.attn_norm" in found["summary"]
    # x.half() ** 2 overflows on massive activations: the output collapses to 0
    assert found["evidence"]["modules"]["blocks.0.attn_norm"]["massive_activations"] > 0.5
    assert found["remedy"]
    assert run.code == 1


def test_a_norm_without_the_fp32_upcast_fails_only_in_a_low_precision_model(run_check):
    fp32 = run_check("--target", handmade("norm_no_upcast"), "--only", "norm")
    assert fp32.finding("norm.extreme_inputs")["status"] == "pass"
    fp16 = run_check(
        "--target", handmade("norm_no_upcast"), "--only", "norm", "--device", "emu:fp16-mixed"
    )
    assert fp16.finding("norm.extreme_inputs")["status"] == "fail"
    # the same model with the upcast survives fp16 mixed precision
    fixed = run_check("--target", handmade("clean"), "--only", "norm", "--device", "emu:fp16-mixed")
    assert fixed.finding("norm.extreme_inputs")["status"] == "pass"


def test_function_based_rope_in_bf16_is_found_by_behaviour_and_fails(run_check):
    run = run_check("--target", handmade("rope_bf16"), "--only", "rope", "--device", "emu:bf16")
    found = run.finding("rope.position_sweep")
    assert found["status"] == "fail", found
    assert "blocks.0.attn" in found["summary"]
    assert "rope_angles_cos_sin" in str(found["evidence"])
    assert run.root_cause == "rope.position_sweep"


def test_function_based_rope_in_bf16_fails_where_fp32_angles_pass(run_check):
    """Under bf16 mixed precision the fp32 angles stay exact; the bf16 ones do not."""
    bad = run_check(
        "--target", handmade("rope_bf16"), "--only", "rope", "--device", "emu:bf16-mixed"
    )
    assert bad.finding("rope.position_sweep")["status"] == "fail"
    good = run_check("--target", handmade("clean"), "--only", "rope", "--device", "emu:bf16-mixed")
    assert good.finding("rope.position_sweep")["status"] == "pass", good.finding(
        "rope.position_sweep"
    )


@pytest.mark.parametrize("name", ["clean", "tuple_batch", "dict_batch"])
def test_masking_works_whatever_the_batch_looks_like(run_check, name):
    run = run_check("--target", handmade(name), "--only", "attention.masking")
    found = run.finding("attention.masking")
    assert found["status"] == "pass", found
    assert found["evidence"]["mask_argument"] == "mask"
    assert found["evidence"]["softmax_calls_over_the_keys"] == 2  # one per layer: measured


def test_torch_layernorm_and_rmsnorm_in_fp32_pass_extreme_inputs_on_cpu(run_check):
    run = run_check("--target", handmade("torch_norms"), "--only", "norm")
    found = run.finding("norm.extreme_inputs")
    assert found["status"] == "pass", found
    modules = found["evidence"]["modules"]
    assert {m["type"] for m in modules.values()} == {"LayerNorm", "RMSNorm"}
    # the cases real activations reach were all run, massive activations included
    assert all(isinstance(m["massive_activations"], float) for m in modules.values())
    assert modules["1"]["centres"] is True and modules["3"]["centres"] is False


def test_custom_modules_are_judged_against_the_oracle_not_their_own_casts(run_check):
    """Re-running the module's own x.half() "in fp64" gave error 0; the oracle does not."""
    clean = run_check("--target", handmade("clean"), "--only", "ops.custom_modules")
    assert clean.finding("ops.custom_modules")["status"] == "pass"
    bad = run_check("--target", handmade("norm_squares_fp16"), "--only", "ops.custom_modules")
    found = bad.finding("ops.custom_modules")
    assert found["status"] == "fail"
    assert "(RMSNorm)" in found["summary"]


def test_a_mask_the_attention_drops_is_found_with_a_tensor_batch(run_check):
    run = run_check("--target", handmade("mask_ignored"), "--only", "attention.masking")
    found = run.finding("attention.masking")
    assert found["status"] == "fail"
    assert found["evidence"]["max_probability_on_masked_keys"] > 1e-3


@pytest.mark.slow
@pytest.mark.parametrize("checklist", ["llama-inference", "quick", "fp8", "serving"])
def test_correct_handwritten_decoder_has_no_failure_in_other_shipped_checklists(
    run_check, checklist
):
    run = run_check("--checklist", checklist, "--target", handmade("clean"))
    assert run.statuses("fail") == [] and run.statuses("error") == [], run.out
    assert run.code == 0


def test_every_shipped_checklist_is_covered_by_a_clean_run_on_cpu(capsys):
    """A new shipped checklist must join the clean-code runs above and in test_checklist."""
    from precguard.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["check", "--list"])
    assert exited.value.code == 0
    [shipped] = [line for line in capsys.readouterr().out.splitlines() if "checklists:" in line]
    assert (
        shipped.split("checklists:")[1].strip()
        == "fp8, llama-finetune, llama-inference, quick, serving"
    )


def test_a_module_rotating_channel_pairs_from_a_table_is_found_and_judged(run_check):
    """No cos/sin in the forward, no *Rotary* name: the rotation itself gives RoPE away."""
    clean = run_check("--target", handmade("table_rope"), "--only", "rope.position_sweep")
    found = clean.finding("rope.position_sweep")
    assert found["status"] == "pass", found
    modules = found["evidence"]["modules"]
    assert set(modules) == {"blocks.0.attn.rotation", "blocks.1.attn.rotation"}
    assert modules["blocks.0.attn.rotation"]["found_by"].startswith("behaviour: rotates")
    # the same table built from bf16 angles: its angles leave the line position x frequency
    bad = run_check("--target", handmade("table_rope_bf16_angles"), "--only", "rope.position_sweep")
    failed = bad.finding("rope.position_sweep")
    assert failed["status"] == "fail", failed
    assert "blocks.0.attn.rotation" in failed["summary"]


def test_a_low_precision_device_is_judged_by_its_own_precision_in_reduce(run_check):
    """bf16/fp16 storage rounds reordering away: its gap to fp32 is no bug within a few eps."""
    clean = run_check(
        "--target", handmade("clean"), "--only", "reduce", "--device", "emu:bf16-mixed"
    )
    found = clean.finding("reduce.order_sensitivity")
    assert found["status"] == "pass", found
    assert "precision emu:bf16-mixed computes in" in found["summary"]
    # a real fault far beyond the dtype's precision is still a difference to localise
    bad = run_check(
        "--target",
        handmade("large_activations_no_upcast"),
        "--only",
        "reduce",
        "--device",
        "emu:fp16-mixed",
    )
    assert bad.finding("reduce.order_sensitivity")["status"] == "warn"
