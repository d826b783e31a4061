"""Print, for each case of issue 32's corpus, the findings ranked by impact and each remedy's
before/after (the closing note's figures).

    PYTHONPATH=src:. python benchmarks/impact_corpus.py [--device cpu --dtype bfloat16]

The findings are the modules compare names for each bug (given here, so that each case
costs only its re-runs); the KV-cache case goes through generate-diff's decoding.
"""

from __future__ import annotations

import argparse
import time

from precguard.generation.cache_remedy import verify_cache_remedy
from precguard.generation.decode import DecodeSide, decode
from precguard.localize.impact import ActualSide, error_budget
from precguard.localize.verify import verify_remedies
from precguard.models.parallel_decoder import lm_batch
from precguard.target import load_target

CORPUS = "tests/localize/impact_corpus.py:"
ROTARY = "model.rotary_emb"
V_PROJ = "model.layers.1.self_attn.v_proj"
NORMS = ["transformer.h.0.ln_attn", "transformer.h.0.ln_mlp", "transformer.h.1.ln_attn"]
NORMS += ["transformer.h.1.ln_mlp", "transformer.h.2.ln_attn", "transformer.h.2.ln_mlp"]
NORMS += ["transformer.ln_f"]

CASES = {
    "rotary bug": (CORPUS + "rope_bug", [ROTARY]),
    "norm in bf16": ("parallel-decoder-norm-low-precision", NORMS),
    "loss on bf16 logits": ("parallel-decoder-loss-low-precision", ["loss_fn"]),
    "planted projection fault": (CORPUS + "projection_bug", [V_PROJ]),
    "HF's rounded inv_freq": (CORPUS + "clean", [ROTARY]),
    "two faults at once": (CORPUS + "two_bugs", [ROTARY, V_PROJ]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    for case, (target, modules) in CASES.items():
        start = time.perf_counter()
        side = ActualSide.open(target, device=args.device, dtype=args.dtype)
        budget = verify_remedies(side, error_budget(side, [(m, "finding") for m in modules]))
        print(f"== {case}: {target} on {args.device} ({args.dtype})")
        print(
            f"  output error {budget.output_error:.3g}, floor {budget.floor:.3g}, together "
            f"{budget.together:.3g}"
        )
        for rank, impact in enumerate(budget.impacts, 1):
            print(f"  {rank}. {impact.describe()}")
            for check in impact.remedies:
                print(f"       {check.describe()}")
        print(f"  ({time.perf_counter() - start:.0f} s)")
    start = time.perf_counter()
    golden = DecodeSide.build(load_target("parallel-decoder-step"), "cpu")
    prompt = lm_batch(0)["input_ids"][:1, :16]
    tokens = decode(golden, prompt, 8, cache_free=False).chosen
    for name in ("parallel-decoder-cache-fp16", "parallel-decoder-step"):
        actual = DecodeSide.build(load_target(name), args.device, args.dtype)
        check = verify_cache_remedy(golden, actual, prompt, tokens, where="layers.0.values")
        print(f"== KV cache: {name} on {args.device} ({args.dtype}), 8 tokens")
        print(f"       {check.describe()}")
    print(f"  ({time.perf_counter() - start:.0f} s)")


if __name__ == "__main__":
    main()
