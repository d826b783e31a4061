"""``precguard generate-diff``: the first token where two backends' decoding differs, and why."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from precguard.cli._app import app

_HELP = """Decode the same prompts on a reference and on DEVICE and find where they part.

Greedy decoding (or seeded sampling with --sample) with a KV cache on both sides.
Per prompt: the first step where the chosen tokens differ, judged a near-tie (the
two tokens are within what the compute precision explains for the logits) or a
divergence; the KL divergence and top-k overlap of the next-token distributions
along the steps (after a flip both sides are fed the golden's tokens, so the curves
stay comparable); the KV caches after the prefill and after N steps. The first real
divergence is replayed teacher-forced under monitor on both sides and compared
layer by layer: the first divergent layer at that token.

Exit codes: 0 no divergence (near-ties at most), 1 a divergence, 2 unusable input.
"""


@app.command("generate-diff", help=_HELP)
def generate_diff_cmd(
    target: str = typer.Option(
        "tiny-llama", "--target", "-t", help="Built-in name, path/file.py[:fn] or pkg.mod[:fn]."
    ),
    device: str = typer.Option(..., "--device", "-d", help="Device under test: emu:bf16, npu…"),
    reference: str = typer.Option("cpu", "--reference", help="Trusted reference device."),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="Model dtype on DEVICE (default: float32, or a mixed-precision profile's).",
    ),
    reference_dtype: str | None = typer.Option(
        None, "--reference-dtype", help="Model dtype on the reference (default: float32)."
    ),
    reference_target: str | None = typer.Option(
        None, "--reference-target", help="Another target for the reference side."
    ),
    prompts: Path | None = typer.Option(
        None,
        "--prompts",
        help="Prompts file: text (one a line), .jsonl ({'text': ...} or {'input_ids': [...]}) "
        "or .json list [default: the target's texts].",
    ),
    max_new_tokens: int = typer.Option(16, "--max-new-tokens", "-n", help="Tokens to decode."),
    sample: bool = typer.Option(False, "--sample", help="Seeded sampling instead of greedy."),
    seed: int = typer.Option(0, "--seed", help="Seed of the shared sampling noise."),
    temperature: float = typer.Option(1.0, "--temperature", help="Sampling temperature."),
    top_k: int = typer.Option(5, "--top-k", help="k of the top-k overlap."),
    layerwise: bool = typer.Option(
        True, "--layerwise/--no-layerwise", help="Replay the first divergence layer by layer."
    ),
    keep_recordings: Path | None = typer.Option(
        None, "--keep-recordings", help="Keep the replay's two recordings in this directory."
    ),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write the result as JSON here ('-' for stdout)."
    ),
    html_out: Path | None = typer.Option(None, "--html", help="Write an HTML page here."),
) -> None:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    from precguard.errors import UsageError
    from precguard.generation import generate_diff
    from precguard.generation.prompts import read_prompts_file
    from precguard.generation.render import render_terminal
    from precguard.report.page import ensure_writable

    to_stdout = json_out is not None and str(json_out) == "-"
    ensure_writable(json=None if to_stdout else json_out, html=html_out)
    if keep_recordings is not None and keep_recordings.exists() and any(keep_recordings.iterdir()):
        raise UsageError(f"--keep-recordings {keep_recordings}: exists and is not empty")
    given = read_prompts_file(prompts) if prompts is not None else None
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        console=Console(stderr=True),
        transient=True,
        disable=not sys.stderr.isatty(),
    )
    with progress:
        task = progress.add_task("decoding", total=None)

        def on_progress(prompt: int, step: int, steps: int) -> None:
            progress.update(task, description=f"prompt {prompt}", total=steps, completed=step + 1)

        result = generate_diff(
            target,
            device=device,
            reference=reference,
            dtype=dtype,
            reference_dtype=reference_dtype,
            reference_target=reference_target,
            prompts=given,
            max_new_tokens=max_new_tokens,
            sample=sample,
            seed=seed,
            temperature=temperature,
            top_k=top_k,
            layerwise=layerwise,
            keep_recordings=keep_recordings,
            on_progress=on_progress,
        )
    out = Console(stderr=to_stdout, highlight=False, soft_wrap=True)
    render_terminal(result, out)
    text = result.model_dump_json(indent=2)
    if to_stdout:
        typer.echo(text)
    elif json_out is not None:
        from precguard.report.page import write_page

        write_page(json_out, text + "\n", "--json")
    if html_out is not None:
        from precguard.generation.page import write_html

        write_html(result, html_out)
    raise typer.Exit(result.exit_code)
