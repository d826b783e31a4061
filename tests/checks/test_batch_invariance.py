"""``precguard check --checklist serving``: does a prompt's answer depend on its batch?

The user's story: a temperature-0 answer changes with the server's load. They
run the serving checklist; a target with batch-invariant kernels passes
bitwise, and a target with one split-K GEMM whose split count follows the
batch size is named at that GEMM.
"""

from __future__ import annotations

from tests.checks.conftest import planted


def test_batch_invariant_kernels_pass_bitwise(run_check):
    run = run_check(
        "--target",
        "tiny-llama",
        "--device",
        "emu:fp32-batch-invariant",
        "--checklist",
        "serving",
        "--only",
        "batch",
    )
    found = run.finding("batch.invariance")
    assert found["status"] == "pass", found["summary"]
    assert "bitwise identically" in found["summary"]
    assert {c["kind"] for c in found["evidence"]["configs"]} == {"identical"}


def test_a_split_k_chosen_by_the_batch_size_is_named_at_its_layer(run_check):
    run = run_check(
        "--target",
        planted("batch_split_k"),
        "--device",
        "emu:fp32-batch-invariant",
        "--checklist",
        "serving",
        "--only",
        "batch",
    )
    assert run.code == 1, run.out
    found = run.finding("batch.invariance")
    assert found["status"] == "fail"
    first = found["evidence"]["configs"][0]
    assert first["first_module"] == "model.layers.2.mlp.down_proj"
    assert first["forward_call"] == 0  # the prefill: the prompt alone has fewer rows
    assert first["kind"] == "within rounding"  # fp32 partial sums: last bits only
    assert "model.layers.2.mlp.down_proj" in found["remedy"]


def test_an_emulated_batch_dependent_reduction_order_is_found_on_cpu(run_check):
    """emu:fp32-batch-splitk splits every small matmul: the first GEMM of the model."""
    run = run_check(
        "--target",
        "tiny-llama",
        "--device",
        "emu:fp32-batch-splitk",
        "--checklist",
        "serving",
        "--only",
        "batch",
    )
    found = run.finding("batch.invariance")
    assert found["status"] == "fail"
    assert found["evidence"]["configs"][0]["first_module"] == "model.layers.0.self_attn.q_proj"
