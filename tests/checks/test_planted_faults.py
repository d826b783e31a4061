"""Each planted fault makes its own family fail, named as the most likely root cause.

The story of every test: a user runs ``precguard check --checklist
llama-finetune`` on a model with one known porting bug, gets exit 1, and the
diagnosis names the family of that bug first.
"""

from __future__ import annotations

import pytest
import torch

import precguard
from tests.checks.conftest import planted


@pytest.mark.parametrize(
    ("target", "device", "check_id", "symptoms"),
    [
        # fresh noise in every forward: two eager/SDPA runs and the gradients differ too
        ("clock_noise", "cpu", "rng.same_seed", {"attention.sdpa_backend", "grads.first_batch"}),
        ("layernorm_eps0", "cpu", "norm.extreme_inputs", set()),
        ("rope_activation_dtype", "emu:bf16", "rope.position_sweep", set()),
        ("tokenizer_too_big", "cpu", "tokenizer.vocab_range", set()),
        ("shuffled_batches", "cpu", "data.batches", set()),
        # underflowed gradients are the symptom loss scaling prevents
        ("fp16_no_loss_scaling", "emu:fp16", "amp.loss_scaling", {"grads.first_batch"}),
    ],
)
def test_planted_fault_fails_its_family_first(run_check, target, device, check_id, symptoms):
    run = run_check(
        "--checklist", "llama-finetune", "--target", planted(target), "--device", device
    )
    assert run.code == 1, run.out
    assert run.finding(check_id)["status"] == "fail"
    assert run.root_cause == check_id
    assert run.statuses("error") == []
    assert run.finding(check_id)["remedy"]
    # nothing unrelated fails: only the planted check and the symptoms it explains
    assert set(run.statuses("fail")) <= {check_id} | symptoms, run.statuses("fail")


def test_clock_seeded_noise_is_traced_to_its_module(run_check):
    run = run_check("--target", planted("clock_noise"), "--only", "rng.same_seed")
    found = run.finding("rng.same_seed")
    assert found["evidence"]["first_divergent_module"] == "model.layers.1.mlp"
    assert "own torch.Generator" in found["summary"]
    assert "torch.manual_seed" in found["remedy"]


def test_layernorm_without_eps_is_named(run_check):
    run = run_check("--target", planted("layernorm_eps0"), "--only", "norm")
    found = run.finding("norm.extreme_inputs")
    assert "model.norm" in found["summary"]
    assert found["evidence"]["modules"]["model.norm"]["constant_rows"] == "nonfinite"


def test_rope_error_growing_with_position_is_found(run_check):
    """fp32 rope is flat over positions; angles in bf16 grow with the position."""
    clean = run_check("--target", "tiny-llama", "--only", "rope")
    bad = run_check(
        "--target", planted("rope_activation_dtype"), "--device", "emu:bf16", "--only", "rope"
    )
    assert clean.code == 0, clean.out
    assert bad.code == 1
    curve = bad.finding("rope.position_sweep")["evidence"]["modules"]["model.rotary_emb"]
    errors = curve["device_max_abs_error"]
    assert errors[-1] > 4 * errors[0]
    assert max(curve["reference_max_abs_error"]) < 1e-4


def test_casting_the_model_to_bf16_rounds_inv_freq(run_check):
    """model.to(bfloat16) also casts HF's inv_freq buffer: the angles drift with position.

    A real pitfall, not a false alarm: the fp32 buffer is what keeps HF's rope exact.
    """
    run = run_check("--target", "tiny-llama", "--dtype", "bfloat16", "--only", "rope")
    assert run.code == 1
    summary = run.finding("rope.position_sweep")["summary"]
    assert "grows with position" in summary
    assert "inv_freq buffer is bfloat16" in summary


def test_shuffled_batches_are_reported_as_order(run_check):
    run = run_check("--target", planted("shuffled_batches"), "--only", "data")
    assert run.finding("data.batches")["evidence"]["difference"] == "order"


def test_loss_scaling_declared_on_the_target_passes(run_check):
    run = run_check("--target", planted("fp16_with_loss_scaling"), "--device", "emu:fp16")
    assert run.finding("amp.loss_scaling")["status"] == "pass"
    assert run.code == 0, run.out
    bad = run_check(
        "--target", planted("fp16_no_loss_scaling"), "--device", "emu:fp16", "--only", "amp"
    )
    ev = bad.finding("amp.loss_scaling")["evidence"]
    assert ev["underflow_share_unscaled"] > 0.01 > ev["underflow_share_scaled"]


def test_tokenizer_out_of_range_ids_are_listed(run_check):
    run = run_check("--target", planted("tokenizer_too_big"), "--only", "tokenizer")
    ev = run.finding("tokenizer.vocab_range")["evidence"]
    assert ev["embedding_rows"] == 256
    assert min(ev["ids_out_of_range"]) >= 256


def test_an_eps_that_rounds_to_zero_in_fp16_is_named(run_check):
    fp32 = run_check("--target", planted("rmsnorm_eps_below_fp16"), "--only", "norm")
    fp16 = run_check(
        "--target", planted("rmsnorm_eps_below_fp16"), "--device", "emu:fp16", "--only", "norm"
    )
    assert fp32.code == 0, fp32.out
    failures = fp16.finding("norm.extreme_inputs")["evidence"]["failures"]
    assert any("rounds to 0 in float16" in f for f in failures)


def test_an_init_that_ignores_the_seed_names_the_weights(run_check):
    run = run_check("--target", planted("unseeded_init"), "--only", "rng.same_seed")
    assert run.code == 1
    found = run.finding("rng.same_seed")
    assert "model.layers.2.mlp.up_proj" in found["summary"]
    assert found["evidence"]["init_differs"] == ["model.layers.2.mlp.up_proj.weight"]


def test_a_static_loss_scale_that_overflows_is_halved_like_a_dynamic_scaler(tmp_path):
    spec = tmp_path / "static-scale.yaml"  # a checklist of one's own, with a check's params
    spec.write_text(
        "name: static-scale\n"
        "description: a static loss scale 16x too large for fp16\n"
        "checks:\n"
        "  - id: amp.loss_scaling\n"
        "    params: {loss_scale: 1048576.0}  # 2**20\n"
    )
    d = precguard.check(spec, planted("fp16_no_loss_scaling"), device="emu:fp16")
    (found,) = d.findings
    assert found.status == "fail" and "overflows the gradients" in found.summary
    # halved until the gradients are finite, as torch.amp.GradScaler would skip steps
    assert found.evidence["overflow_skips_before_finite"] == 5
    assert found.evidence["scale_tried"] == pytest.approx(2.0**15, rel=1e-3)


def test_batches_are_classified_by_one_rule_for_a_second_pass_and_a_golden():
    """Order, padding and content are told apart the same way whatever the other side is."""
    from precguard.checks.data import _classify
    from precguard.checks.fingerprints import padding_hash, sample_hashes, value_hash
    from precguard.targets import lm_batch

    ids = lm_batch(0)["input_ids"]

    def padded(side: str, rows=ids) -> dict:
        mask = torch.ones_like(rows)
        if side == "left":
            mask[:, :4] = 0
        else:
            mask[:, -4:] = 0
        return {"input_ids": rows, "attention_mask": mask}

    def fingerprint(batches):
        return (
            [value_hash(b) for b in batches],
            [sample_hashes(b) for b in batches],
            [padding_hash(b) for b in batches],
        )

    right = [padded("right"), padded("right", ids.flip(0))]
    assert _classify(right, *fingerprint(right)) == ("identical", [])
    assert _classify(right, *fingerprint(right[::-1]))[0] == "order"
    assert _classify(right, *fingerprint([padded("left"), right[1]])) == ("padding", [0])
    assert _classify(right, *fingerprint([padded("right", ids + 1), right[1]])) == ("content", [0])
