"""Compare's verdicts on mixture-of-experts pairs (issue 28): tiny Mixtral or Qwen2-MoE
(hidden 64, 2 layers, 4 experts, top-2, 2 x 64 tokens, seeded), golden on the CPU in fp32,
actual on ``emu:bf16``; batched (``grouped_mm``) or per-expert (``eager``) experts.

Cases: ``clean``; ``experts`` (layer 1's experts return 3 % too much); ``expert1`` (3 % too
much on the tokens expert 1 serves); ``router`` (layer 1's router sends every token to the
next experts). Tensors: ``full`` (both sides), ``stats`` (both statistics only), ``gfull``
(golden full, actual statistics only). One line per pair: verdict, counts, first divergence.

    .venv/bin/python benchmarks/moe_verdicts.py [--model mixtral|qwen] [--experts grouped_mm]
        [--tensors full] [--case clean ...]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import torch
from torch import nn

import precguard
from precguard.target import Target
from precguard.targets import causal_lm_loss, lm_batch


def build(model: str, experts: str) -> nn.Module:
    """The tiny model, seeded by the caller."""
    from transformers import MixtralConfig, MixtralForCausalLM, Qwen2MoeConfig, Qwen2MoeForCausalLM

    common = {
        "vocab_size": 256,
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 256,
        "num_experts_per_tok": 2,
    }
    if model == "mixtral":
        config = MixtralConfig(**common, num_local_experts=4)
        built: nn.Module = MixtralForCausalLM(config)
    else:
        config = Qwen2MoeConfig(
            **common, moe_intermediate_size=64, shared_expert_intermediate_size=128, num_experts=4
        )
        built = Qwen2MoeForCausalLM(config)
    built.config._attn_implementation = "eager"
    built.config._experts_implementation = experts
    return built


def plant(case: str) -> object:
    """The ``prepare`` of a case (None: clean)."""

    def experts(model: nn.Module) -> None:
        model.get_submodule("model.layers.1.mlp.experts").register_forward_hook(
            lambda _m, _a, out: out * 1.03
        )

    def expert1(model: nn.Module) -> None:
        def scaled(_m: nn.Module, args: tuple[torch.Tensor, ...], out: torch.Tensor) -> object:
            return torch.where((args[1] == 1).any(dim=-1)[:, None], out * 1.03, out)

        model.get_submodule("model.layers.1.mlp.experts").register_forward_hook(scaled)

    def router(model: nn.Module) -> None:
        def shifted(_m: nn.Module, _a: object, out: tuple[torch.Tensor, ...]) -> object:
            return out[0], out[1], (out[2] + 1) % 4

        model.get_submodule("model.layers.1.mlp.gate").register_forward_hook(shifted)

    return {"clean": None, "experts": experts, "expert1": expert1, "router": router}[case]


def main() -> None:
    """Record, compare and print one line per pair."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["mixtral", "qwen"], default="mixtral")
    parser.add_argument("--experts", nargs="+", default=["grouped_mm", "eager"])
    parser.add_argument("--tensors", nargs="+", default=["full", "stats", "gfull"])
    parser.add_argument("--case", nargs="+", default=["clean", "experts", "expert1", "router"])
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for experts in args.experts:
            target = Target(
                model=lambda experts=experts: build(args.model, experts),
                batch=lambda step: lm_batch(step, seq=64),
                loss=causal_lm_loss,
                seed=0,
                name=f"{args.model}-{experts}",
            )
            for tensors in args.tensors:
                golden = precguard.record_target(
                    target, out=root / f"g-{experts}-{tensors}", tensors=tensors != "stats"
                )
                for case in args.case:
                    actual = precguard.record_target(
                        target,
                        device="emu:bf16",
                        out=root / f"a-{experts}-{tensors}-{case}",
                        tensors=tensors == "full",
                        prepare=plant(case),  # type: ignore[arg-type]
                    )
                    result = precguard.compare_runs(golden, actual)
                    c = result.counts
                    fd = result.first_divergence
                    named = f"{fd.module} ({fd.key.rsplit('.', 3)[-3:][1]})" if fd else "-"
                    print(
                        f"{args.model:8} {experts:10} {tensors:5} {case:8} "
                        f"{result.verdict.upper():9} pass {c.passed} fail {c.failed} shape "
                        f"{c.shape_mismatch} | full {c.full} stats {c.stats_only}  first: {named}",
                        flush=True,
                    )


if __name__ == "__main__":
    main()
