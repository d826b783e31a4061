"""compare's verdicts on mixture-of-experts families held out of the real-stacks corpus.

The corpus (``tests/realstacks/corpus.py``) holds the stacks the routing rules were built
on; a rule is tried on families it never saw before it is called done. This script records
each held-out family the way the corpus does (tiny seeded ``transformers`` configs, golden
cpu float32, actual ``emu:bf16``), as one forward and one training step, full tensors and
statistics only, clean and with a planted fault in layer 1's routed experts (3 % of what
they compute with full tensors; 3 % of expert 1's output projection with statistics), and
prints one line a pair. Exit 1 on a wrong verdict.

    .venv/bin/python benchmarks/heldout_moe.py [FAMILY ...]

Families: olmoe (softmax top-k, no renormalization), granitemoe (``block_sparse_moe``,
parallel experts), glm4-moe (sigmoid scores with a correction bias, group-limited top-k, a
shared expert), ernie-moe (a shared expert, top-k renormalized). Llama 4 and PhiMoE were
held out too, false-alarmed, and moved into the corpus with the fixes (docs/realworld.md).
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch  # noqa: E402
import transformers as tf  # noqa: E402
from tests.realstacks import corpus  # noqa: E402
from torch import nn  # noqa: E402

COMMON = {"vocab_size": corpus.VOCAB, "num_hidden_layers": 2, "max_position_embeddings": 1024}
LLAMA_LIKE = {
    "hidden_size": corpus.HIDDEN, "intermediate_size": 176, "num_attention_heads": 4,
    "num_key_value_heads": 2,
}  # fmt: skip

FAMILIES: dict[str, Callable[[], nn.Module]] = {
    "olmoe": lambda: tf.OlmoeForCausalLM(
        tf.OlmoeConfig(**COMMON, **LLAMA_LIKE, num_experts=8, num_experts_per_tok=2)
    ),
    "granitemoe": lambda: tf.GraniteMoeForCausalLM(
        tf.GraniteMoeConfig(**COMMON, **LLAMA_LIKE, num_local_experts=4, num_experts_per_tok=2)
    ),
    "glm4-moe": lambda: tf.Glm4MoeForCausalLM(
        tf.Glm4MoeConfig(
            **COMMON,
            **LLAMA_LIKE,
            moe_intermediate_size=32,
            n_routed_experts=8,
            num_experts_per_tok=2,
            n_group=2,
            topk_group=1,
            first_k_dense_replace=0,
            n_shared_experts=1,
            head_dim=16,
        )
    ),
    "ernie-moe": lambda: tf.Ernie4_5_MoeForCausalLM(
        tf.Ernie4_5_MoeConfig(
            **COMMON,
            **LLAMA_LIKE,
            moe_num_experts=8,
            moe_k=2,
            moe_intermediate_size=32,
            moe_layer_start_index=0,
            moe_num_shared_experts=1,
        )
    ),
}


def experts_of(model: nn.Module) -> nn.Module:
    """Layer 1's routed experts, wherever the family keeps them."""
    for name, module in model.model.layers[1].named_modules():
        if name.endswith("experts") and "shared" not in name:
            return module
    raise LookupError("no routed experts in layer 1")


def output_fault(model: nn.Module) -> None:
    """What layer 1's experts compute, 3 % too large (their weights equal)."""
    corpus.scale_output(experts_of(model), 1.03)


def weight_fault(model: nn.Module) -> None:
    """Expert 1's output projection in layer 1, 3 % too large."""
    experts = experts_of(model)
    with torch.no_grad():
        for name, p in experts.named_parameters():
            if p.dim() == 3 and any(s in name for s in ("down", "output", "w2")):
                p[1] *= 1.03
                return
        for name, p in experts.named_parameters():
            if name.startswith("1.") and any(s in name for s in ("down", "w2")):
                p *= 1.03
                return
    raise LookupError("no expert output projection in layer 1")


def main() -> int:
    """Run the held-out families and print the table."""
    kinds = sys.argv[1:] or list(FAMILIES)
    unknown = [k for k in kinds if k not in FAMILIES]
    if unknown:
        print(f"unknown family {unknown[0]!r}; one of {', '.join(FAMILIES)}", file=sys.stderr)
        return 2
    built = corpus.hf_model

    def hf_model(kind: str) -> nn.Module:
        if kind not in FAMILIES:
            return built(kind)
        torch.manual_seed(0)
        return FAMILIES[kind]()

    corpus.hf_model = hf_model  # the corpus's workloads build their model through it
    cases = []
    for kind in kinds:
        for full, level in ((True, "full"), (False, "stats")):
            fault = output_fault if full else weight_fault
            for workload, what in ((corpus.forward, "forward"), (corpus.training_step, "step")):
                cases.append(corpus.Case(f"{kind} {what} clean [{level}]", workload(kind), full))
                cases.append(
                    corpus.Case(
                        f"{kind} {what} fault [{level}]",
                        workload(kind, fault),
                        full,
                        expect="layers.1.",
                    )
                )
    wrong = 0
    with tempfile.TemporaryDirectory(prefix="precguard-heldout-") as tmp:
        for case in cases:
            o = corpus.run_case(case, Path(tmp))
            wrong += not o.ok
            mark = "ok  " if o.ok else "WRONG"
            print(f"{mark:5} {case.name:32} {o.verdict:9} {o.named or '-'}")
            if not o.ok:
                print(f"      {o.text[:300]}")
    print(f"pairs: {len(cases)}, wrong verdicts: {wrong}")
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
