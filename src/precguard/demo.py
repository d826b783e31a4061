"""``make demo``: find a planted precision fault in a tiny LLaMA, on the CPU.

Records the built-in ``tiny-llama`` target twice — once as it is (the golden)
and once with one RMSNorm computing in float16, the classic porting bug — then
compares the two recordings and names the layer that introduced the error.

    python -m precguard.demo [--out demo-runs] [--layer 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

from precguard.capture.hooks import on_calls


def plant_fp16_rmsnorm(model: nn.Module, name: str) -> None:
    """Make the RMSNorm ``name`` compute in float16, as a port without an fp32 upcast would."""
    norm = model.get_submodule(name)

    def fp16_forward(
        _name: str, _mod: nn.Module, args: tuple, output: torch.Tensor
    ) -> torch.Tensor:
        x = args[0].half()
        variance = x.pow(2).mean(-1, keepdim=True)
        normed = x * torch.rsqrt(variance + norm.variance_epsilon)
        return (norm.weight.half() * normed).to(output.dtype)

    # the planted bug stays for the model's life (the demo builds the model for one run)
    on_calls(norm, post=fp16_forward, modules=["root"], with_kwargs=False, errors="raise")


def main(argv: list[str] | None = None) -> int:
    """Run the demo; return the process exit code."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("demo-runs"))
    parser.add_argument("--layer", type=int, default=2, help="decoder layer to plant the fault in")
    args = parser.parse_args(argv)

    from rich.console import Console

    import precguard
    from precguard.compare.render import render

    console = Console()
    planted = f"model.layers.{args.layer}.post_attention_layernorm"
    golden, actual = args.out / "golden", args.out / "fp16-rmsnorm"
    console.print(f"[bold]1. Recording[/] tiny-llama on the CPU (golden) -> {golden}")
    cpu = precguard.Side("tiny-llama")  # one side: target, device (the CPU), dtype, set-up
    precguard.record_target(cpu, out=golden, steps=2, tensors=True, overwrite=True)
    console.print(f"[bold]2. Recording[/] again with {planted} computing in float16 -> {actual}")
    planted_side = cpu.replace(prepare=lambda model: plant_fp16_rmsnorm(model, planted))
    precguard.record_target(planted_side, out=actual, steps=2, tensors=True, overwrite=True)
    console.print("[bold]3. Comparing[/] the two recordings layer by layer\n")
    result = precguard.compare_runs(golden, actual)
    render(result, console, top=8)
    found = result.first_divergence.module if result.first_divergence else None
    console.print(
        f"\nplanted fault: [bold]{planted}[/]   first divergence found: [bold]{found}[/]  "
        + ("[green]✓ localized[/]" if found == planted else "[red]✗ missed[/]")
    )
    exe = Path(sys.executable).parent / "precguard"
    cli = str(exe) if exe.exists() else "precguard"
    console.print(
        f"recordings: {golden}/ and {actual}/\n"
        f"reproduce:  {cli} compare {golden} {actual} --json diff.json"
    )
    return 0 if found == planted else 1


if __name__ == "__main__":
    sys.exit(main())
