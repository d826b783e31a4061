"""Checks that need a golden recording or a particular emulated device."""

from __future__ import annotations

from pathlib import Path

import pytest

import precguard
from precguard import record_target
from tests.checks.conftest import planted


@pytest.fixture(scope="module")
def golden(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-llama recorded forward-only on the CPU for two steps."""
    out = tmp_path_factory.mktemp("golden") / "cpu"
    return record_target("tiny-llama", device="cpu", out=out, steps=2)


def test_same_device_matches_the_golden_layer_by_layer(run_check, golden):
    run = run_check(
        "--target", "tiny-llama", "--golden", str(golden), "--only", "layerwise", "--only", "data"
    )
    assert run.code == 0, run.out
    assert run.finding("layerwise.first_divergence")["status"] == "pass"
    assert run.finding("data.batches")["evidence"]["golden_steps_compared"] == 2


def test_bf16_device_matches_the_golden_within_bf16(run_check, golden):
    # rounding to the device's precision is not a fault (compare judges by bf16)
    run = run_check(
        "--target",
        "tiny-llama",
        "--device",
        "emu:bf16",
        "--golden",
        str(golden),
        "--only",
        "layerwise",
    )
    assert run.code == 0, run.out
    assert run.finding("layerwise.first_divergence")["status"] == "pass"


def test_bf16_device_diverges_from_the_golden_at_a_named_layer(run_check, golden):
    run = run_check(
        "--target",
        planted("layernorm_eps0"),
        "--device",
        "emu:bf16",
        "--golden",
        str(golden),
        "--only",
        "layerwise",
    )
    assert run.code == 1
    found = run.finding("layerwise.first_divergence")
    assert found["status"] == "fail"
    assert found["evidence"]["module"] == "model.norm"
    assert "precguard replay" in found["remedy"]


def test_other_data_than_the_golden_is_a_data_failure_first(run_check, golden):
    run = run_check(
        "--target",
        planted("other_data"),
        "--golden",
        str(golden),
        "--only",
        "data",
        "--only",
        "layerwise",
    )
    assert run.code == 1
    assert run.root_cause == "data.batches"
    assert (
        run.finding("data.batches")["evidence"]["golden_mismatch"][0]["input"] == "kwargs.input_ids"
    )


def test_golden_must_be_a_recording(run_check, tmp_path):
    run = run_check("--golden", str(tmp_path))
    assert run.code == 2
    assert "not a precguard recording" in run.err


def test_shuffled_reduction_order_is_recognised_as_order_noise():
    d = precguard.check("llama-finetune", "tiny-llama", device="emu:fp32-shuffled", only=["reduce"])
    (found,) = d.findings
    assert found.status == "pass"
    assert found.evidence["device_vs_reference_rel"] > 0
    assert "order noise" in found.summary


def test_a_different_rng_stream_matters_only_when_the_model_draws_random_numbers():
    clean = precguard.check(
        "llama-finetune", "tiny-llama", device="emu:fp32-rng", only=["rng.cross_device"]
    )
    (found,) = clean.findings
    assert found.status == "pass"
    assert found.evidence["dropout_mask_agreement"] < 1
    assert found.remedy == ""  # nothing to fix; the advice is in the summary
    dropout = precguard.check(
        "llama-finetune", planted("with_dropout"), device="emu:fp32-rng", only=["rng.cross_device"]
    )
    (found,) = dropout.findings
    assert found.status == "fail"
    assert "dropout masks" in found.summary
    assert "manual_seed" in found.remedy


def test_a_dropped_padding_mask_leaks_probability_onto_padding(run_check):
    clean = run_check(
        "--target", "tiny-llama", "--device", "emu:fp16", "--only", "attention.masking"
    )
    assert clean.code == 0, clean.out
    bad = run_check("--target", planted("ignores_padding_mask"), "--only", "attention.masking")
    assert bad.code == 1
    found = bad.finding("attention.masking")
    assert found["evidence"]["max_probability_on_masked_keys"] > 0.01
    assert "receive probability" in found["summary"]


def test_fingerprints_next_to_the_golden_catch_order_and_tokenizer(run_check, tmp_path):
    from precguard.cli import main

    golden = record_target("tiny-llama", device="cpu", out=tmp_path / "golden")
    with pytest.raises(SystemExit) as exc:
        main(["check", "--target", "tiny-llama", "--fingerprints-out", str(golden)])
    assert exc.value.code == 0
    assert (golden / "fingerprints.json").is_file()

    same = run_check(
        "--target", "tiny-llama", "--golden", str(golden), "--only", "data", "--only", "tokenizer"
    )
    assert same.code == 0, same.out
    assert same.finding("tokenizer.matches_golden")["status"] == "pass"
    assert same.finding("data.batches")["evidence"]["golden_fingerprints_compared"] == 4

    other_tokens = run_check(
        "--target",
        planted("tokenizer_too_big"),
        "--golden",
        str(golden),
        "--only",
        "tokenizer.matches_golden",
    )
    assert other_tokens.finding("tokenizer.matches_golden")["status"] == "fail"

    reordered = run_check(
        "--target", planted("other_data"), "--golden", str(golden), "--only", "data"
    )
    assert reordered.finding("data.batches")["evidence"]["golden_difference"] == "content"


@pytest.mark.parametrize(
    ("device", "status", "op"),
    [
        ("cpu", "pass", None),
        ("emu:fp16", "pass", None),
        ("emu:softmax-fp16", "fail", "softmax"),
        ("emu:fp16-lowacc", "fail", "sum_4096"),
    ],
)
def test_single_ops_below_the_device_precision_are_named(device, status, op):
    d = precguard.check("llama-finetune", "tiny-llama", device=device, only=["ops.op_precision"])
    (found,) = d.findings
    assert found.status == status, found.summary
    if op:
        assert op in found.evidence["lowered"]


def test_padding_on_the_other_side_than_the_golden_is_named(run_check, tmp_path):
    from precguard import load_target
    from precguard.checks import fingerprints

    golden = record_target(planted("right_padded"), device="cpu", out=tmp_path / "golden")
    fingerprints.write(golden, load_target(planted("right_padded")))
    run = run_check("--target", planted("left_padded"), "--golden", str(golden), "--only", "data")
    assert run.code == 1
    assert run.finding("data.batches")["evidence"]["golden_difference"] == "padding"


def test_the_rng_checks_share_one_device_build_of_the_model():
    """A large model takes minutes to build: the run builds it no more often than needed.

    One reference model for the copies, a second same-seed build on the device, one
    build through the reference backend; the first device build serves both checks.
    """
    from precguard import Target
    from precguard.targets import build_tiny_llama, lm_batch

    builds = []

    def model():
        builds.append(1)
        return build_tiny_llama()

    target = Target(model=model, batch=lm_batch, name="counted")
    d = precguard.check("llama-finetune", target, only=["rng"])
    assert [f.status for f in d.findings] == ["pass", "pass"]
    assert len(builds) == 4
