"""``precguard generate-diff``: the first token where two backends' decoding differs, and why."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from precguard.cli._app import app
from precguard.cli._out import wrote

_HELP = (
    "Decode the same prompts on a reference and on DEVICE and find where they part.\n\n"
    "Greedy decoding (or seeded sampling with --sample) with a KV cache on both sides. Per "
    "prompt: the first step where the chosen tokens differ, judged a near-tie (the two tokens "
    "are within what the compute precision explains for the logits) or a divergence; the KL "
    "divergence and top-k overlap of the next-token distributions along the steps (after a "
    "flip both sides are fed the golden's tokens, so the curves stay comparable); the KV "
    "caches after the prefill and after N steps. The first real divergence is replayed "
    "teacher-forced under monitor on both sides and compared layer by layer: the first "
    "divergent layer at that token.\n\n"
    "A reference on another machine: --save-run GOLDEN there, --save-run ACTUAL --against "
    "GOLDEN on the machine under test (same prompts and options, fed the golden's tokens; its "
    "replay of the first divergence is kept in ACTUAL/layerwise), then generate-diff GOLDEN "
    "ACTUAL anywhere (add --target and --reference on the reference machine to compare the "
    "replays layer by layer).\n\n"
    "Exit codes: 0 no divergence (near-ties at most), 1 a divergence, 2 unusable input, 3 "
    "inconclusive (saved runs of 0 steps: nothing was compared)."
)


@app.command("generate-diff", help=_HELP)
def generate_diff_cmd(
    runs: list[Path] | None = typer.Argument(
        None, metavar="[GOLDEN ACTUAL]", help="Two --save-run directories to compare."
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        "-t",
        help="Built-in name, path/file.py[:fn] or pkg.mod[:fn] (default: tiny-llama).",
    ),
    device: str | None = typer.Option(
        None, "--device", "-d", help="Device under test: emu:bf16, npu… (required unless runs)."
    ),
    reference: str | None = typer.Option(
        None, "--reference", help="Trusted reference device (default: cpu)."
    ),
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
        "or .json list (default: the target's texts).",
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
    save_run: Path | None = typer.Option(
        None, "--save-run", help="Decode on DEVICE only and save it here (a new directory)."
    ),
    against: Path | None = typer.Option(
        None,
        "--against",
        help="With --save-run: a saved golden run to take prompts and tokens from.",
    ),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Apply the cause's remedy and decode again: a KV-cache cause's cache kept in the "
        "model's dtype, verified against the actual's cache-free forward (docs/impact.md).",
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
    from precguard.text import shown

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
    task = progress.add_task("decoding", total=None)

    def on_progress(device: str, prompt: int, step: int, steps: int) -> None:
        what = f"{device}: prompt {prompt}"
        progress.update(task, description=what, total=steps, completed=step + 1)

    if runs:
        from precguard.generation import compare_generation_runs

        if len(runs) != 2:
            raise UsageError(f"expected two saved runs GOLDEN ACTUAL, got {len(runs)}")
        if device is not None or save_run is not None or prompts is not None:
            raise UsageError("comparing saved runs takes no --device, --save-run or --prompts")
        result = compare_generation_runs(
            runs[0],
            runs[1],
            top_k=top_k,
            target=target,
            reference=reference,
            reference_dtype=reference_dtype,
        )
    elif device is None:
        raise UsageError("give --device DEV (or two saved runs GOLDEN ACTUAL to compare)")
    elif save_run is not None:
        from precguard.generation import generate_run
        from precguard.target_run import Side

        if reference is not None or reference_target is not None:
            raise UsageError("--save-run decodes one side (--device); it takes no --reference")
        with progress:
            path = generate_run(
                Side(target or "tiny-llama", device, dtype),
                out=save_run,
                prompts=given,
                max_new_tokens=max_new_tokens,
                sample=sample,
                seed=seed,
                temperature=temperature,
                against=against,
                on_progress=on_progress,
            )
        typer.echo(f"saved the decoding on {shown(device)} to {shown(path)}")
        return
    else:
        if against is not None:
            raise UsageError("--against goes with --save-run")
        from precguard.target_run import Side

        spec = target or "tiny-llama"
        with progress:
            result = generate_diff(
                golden=Side(reference_target or spec, reference or "cpu", reference_dtype),
                actual=Side(spec, device, dtype),
                prompts=given,
                max_new_tokens=max_new_tokens,
                sample=sample,
                seed=seed,
                temperature=temperature,
                top_k=top_k,
                layerwise=layerwise,
                keep_recordings=keep_recordings,
                on_progress=on_progress,
                verify=verify,
            )
    from precguard.text import safe_console

    # the summary quotes saved runs' text (device names, paths, reasons): one escaping console
    out = safe_console(stderr=to_stdout, highlight=False, soft_wrap=True)
    render_terminal(result, out)
    for check in result.remedies:  # wrapped at the terminal's width, never cut
        out.print(f"remedy: {shown(check.describe(), 4000, markup=True)}", soft_wrap=False)
    text = result.model_dump_json(indent=2)
    if to_stdout:
        from precguard.cli._out import print_json

        print_json(text)
    elif json_out is not None:
        from precguard.report.page import write_page

        write_page(json_out, text + "\n", "--json")
        wrote(json_out)
    if html_out is not None:
        from precguard.generation.page import write_html

        write_html(result, html_out)
        wrote(html_out)
    raise typer.Exit(result.exit_code)
