"""Watch a training run: per-step scalars, alerts that name the layer, recorded steps.

Copy this file and swap in your model, data and optimizer. Here a small
``transformers`` LLaMA trains for 40 steps with AdamW; at step 30 the
learning rate of layer 1's attention jumps 30x (a planted fault, standing in
for a scheduler bug), the watch names the layers whose updates jumped, and
records step 31 in full for compare/replay.

    .venv/bin/python examples/watch_training.py [OUT_DIR]
    precguard watch-report OUT_DIR --html watch.html --csv watch.csv
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import precguard


def main(out: Path) -> None:
    torch.manual_seed(0)
    config = LlamaConfig(
        hidden_size=64,
        intermediate_size=176,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=256,
    )
    model = LlamaForCausalLM(config)
    attention = list(model.model.layers[1].self_attn.parameters())
    rest = [p for p in model.parameters() if all(p is not a for a in attention)]
    opt = torch.optim.AdamW([{"params": rest}, {"params": attention}], lr=1e-3)
    gen = torch.Generator().manual_seed(1)
    # this script prints each alert itself: the watch's own log line of it would be a duplicate
    logging.getLogger("precguard").addHandler(logging.NullHandler())
    with precguard.watch(model, opt, every=20, out=out, overwrite=True, on_alert="record") as w:
        for step in range(40):
            ids = torch.randint(0, 256, (2, 32), generator=gen)
            loss = model(input_ids=ids, labels=ids).loss
            loss.backward()
            opt.param_groups[1]["lr"] = 3e-2 if step == 30 else 1e-3  # the planted fault
            opt.step()
            opt.zero_grad()
            for alert in w.step(loss):
                print(f"step {alert.step}: {alert.kind}: {alert.message}")
                print("  layers:", ", ".join(e.layer for e in alert.layers))
    print(f"watch directory: {out} (recorded steps: {w.recording_path})")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path("runs/watch"))
