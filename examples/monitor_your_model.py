"""Instrument your own model, record it twice, and find where the two runs part.

Copy this file and swap in your model and batch. Here a small ``transformers``
LLaMA runs once in float32 (the golden) and once in bfloat16 (the run under
test); on real hardware the two runs would be on two devices.

    .venv/bin/python examples/monitor_your_model.py [OUT_DIR]
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import precguard


def build_model() -> torch.nn.Module:
    torch.manual_seed(0)  # same weights in both runs: initialise on the CPU, then move
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    return LlamaForCausalLM(config).eval()


def record(out: Path, dtype: torch.dtype) -> None:
    model = build_model().to(dtype)
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    # tensors=["model.layers.0.*"] would also save full tensors of layer 0
    with torch.no_grad(), precguard.monitor(model, out=out, overwrite=True):
        model(input_ids=ids)


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "example-runs")
    record(out / "fp32", torch.float32)
    record(out / "bf16", torch.bfloat16)
    # By default each record is judged by the less precise side's precision (bf16
    # here): "is this more than bf16 rounding?". Held to the golden's fp32, bf16
    # diverges where it first rounds.
    for judge in ("golden", "actual"):
        result = precguard.compare_runs(out / "fp32", out / "bf16", tolerance_dtype=judge)
        print(f"judged by the {judge}'s precision: {result.verdict}")
        if result.first_divergence is not None:
            fd = result.first_divergence
            print(f"  first divergence: {fd.module} ({fd.module_type}), local={fd.local}")
            print(f"  why: {fd.reason}")
    print(f"recordings in {out}/; details: precguard compare {out}/fp32 {out}/bf16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
