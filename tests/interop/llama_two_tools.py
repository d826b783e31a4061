"""Record one small seeded LLaMA with msprobe or with precguard (a script; tests run it).

    python llama_two_tools.py --tool msprobe --task statistics --out DIR [--fault] [--backward]
                              [--level L0|L1|mix]
    python llama_two_tools.py --tool precguard --out DIR [--tensors] [--fault] [--backward]

The model (transformers' LlamaForCausalLM, small config, seeded random init, no
download) and its input are the same for both tools. ``--fault`` plants a
precision fault: layer 1's MLP activation rounds its output to bfloat16, as a
kernel computing SiLU in bf16 would. msprobe runs in its own process: it patches
torch APIs process-wide.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

FAULTY_MODULE = "model.layers.1.mlp.act_fn"


def build_model(fault: bool) -> tuple[torch.nn.Module, torch.Tensor]:
    """The seeded model and its input; with ``fault``, layer 1's SiLU rounds to bf16."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=16,
    )
    model = LlamaForCausalLM(config)
    if fault:
        act = model.get_submodule(FAULTY_MODULE)
        act.forward = lambda x: F.silu(x).to(torch.bfloat16).to(x.dtype)  # type: ignore[method-assign]
    ids = torch.randint(0, config.vocab_size, (1, 8), generator=torch.Generator().manual_seed(1))
    return model, ids


def run_step(model: torch.nn.Module, ids: torch.Tensor, backward: bool) -> None:
    """One forward (and backward) pass."""
    if backward:
        model(ids).logits.float().pow(2).mean().backward()
    else:
        with torch.no_grad():
            model(ids)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tool", choices=["msprobe", "precguard"], required=True)
    parser.add_argument("--task", choices=["statistics", "tensor"], default="statistics")
    parser.add_argument("--out", required=True)
    parser.add_argument("--fault", action="store_true")
    parser.add_argument("--backward", action="store_true")
    parser.add_argument("--tensors", action="store_true")
    parser.add_argument("--level", choices=["L0", "L1", "mix"], default="L0")
    args = parser.parse_args()
    model, ids = build_model(args.fault)
    if args.backward:
        model.train()
    else:
        model.eval()
    if args.tool == "precguard":
        import precguard

        with precguard.monitor(model, out=args.out, tensors=args.tensors, backward=args.backward):
            run_step(model, ids, args.backward)
        return
    from msprobe.pytorch import PrecisionDebugger

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    task_cfg = {"scope": [], "list": [], "data_mode": ["all"]}
    if args.task == "statistics":
        task_cfg["summary_mode"] = "statistics"
    config = {
        "task": args.task,
        "dump_path": str(out / "dump"),
        "rank": [],
        "step": [],
        "level": args.level,
        args.task: task_cfg,
    }
    (out / "config.json").write_text(json.dumps(config))
    debugger = PrecisionDebugger(config_path=str(out / "config.json"))
    debugger.start(model=model)
    run_step(model, ids, args.backward)
    debugger.stop()
    debugger.step()


if __name__ == "__main__":
    sys.exit(main())
