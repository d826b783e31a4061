"""``precguard compare`` and ``precguard replay``: find and confirm the layer that diverged."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from precguard.cli._app import app, show_progress

if TYPE_CHECKING:
    from precguard.compare.report import Comparison

_COMPARE_HELP = """Compare ACTUAL with GOLDEN and name the layer that introduced the error.

Records are paired by key (then by order within the same parent module), measured
(full tensors when both runs saved them, else statistics, a weaker test) and judged
by the error their precision (the less precise side's, --tolerance-dtype), their
reduction length and what they consumed explain (--profile fixed: a fixed
tolerance per dtype).

[bold]Reading the verdict[/bold]

[green]match[/green] (exit 0): every paired record is within tolerance.

[red]diverged[/red] (exit 1): some record is not. [bold]first divergence[/bold] names the first
module, in execution order, that made error [italic]itself[/italic] (local): its inputs matched and
it at least doubled the error its precision and inputs explain, or its error is >= 10x
that (the amplification), or its output is scaled relative to golden beyond what its
inputs' scale explains (a systematic bias), or its own weights differ. Records after it
that fail only passed the error on (propagated). [bold]suspects[/bold] lists every other module
that made error of its own. Pairs compared on statistics only (no full tensors) are a
weaker test: the verdict says "likely" and prints the --tensors glob that settles it.

[yellow]partial match[/yellow] (exit 3): what was compared matches, but part of the recordings
was not compared: steps or phases (backward) only one side recorded, or a run that did not
finish (it raised, or was killed). The gaps are printed first. --allow-partial makes it exit 0.

Exit 2: unusable input (missing or corrupt recording, different models, a recording compared
with itself), one line on stderr.

GOLDEN and ACTUAL may each be an msprobe (mindstudio-probe) dump directory, read as a
recording (see docs/msprobe.md; `precguard import-msprobe` converts one once).

Profiles (--profile): default judges each record by the error its precision explains, as
above: it fails beyond 10x that (the amplification), on a significant scale error of its own,
or when NaN/Inf differ. fixed: rel-L2 <= k x assert_close's rtol (k 2 for fp32/fp64, 3 for
fp16/bf16) and cosine >= 0.99. strict: every element as torch.testing.assert_close. msprobe:
Ascend msprobe's lax verdict. --rtol/--atol make the default a fixed tolerance with those
numbers. See docs/compare.md.

Bitwise identity by recorded hashes is its own command: `precguard bitwise GOLDEN ACTUAL`.
"""


@app.command(help=_COMPARE_HELP)
def compare(
    golden: Path = typer.Argument(
        ..., help="Golden (reference) recording directory, or an msprobe dump."
    ),
    actual: Path = typer.Argument(..., help="Recording under test, or an msprobe dump."),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write the full Comparison as JSON to this file ('-' for stdout)."
    ),
    html_out: Path | None = typer.Option(
        None, "--html", help="Write a self-contained HTML report (plots, records table) here."
    ),
    csv_out: Path | None = typer.Option(
        None, "--csv", help="Write one row per record (execution order) as CSV here."
    ),
    junit_out: Path | None = typer.Option(
        None,
        "--junit-xml",
        help="Write JUnit XML here for CI: one test case per record, a failing record a "
        "<failure> (see docs/guard.md).",
        metavar="FILE",
    ),
    profile: str = typer.Option(
        "default", "--profile", help="default (expected error), fixed, strict or msprobe."
    ),
    rtol: float | None = typer.Option(
        None,
        "--rtol",
        help="Relative tolerance in every dtype: judges by a fixed tolerance (rel-L2 <= k x "
        "rtol) instead of the expected error.",
    ),
    atol: float | None = typer.Option(
        None,
        "--atol",
        help="Absolute tolerance in every dtype: judges by a fixed tolerance instead of the "
        "expected error.",
    ),
    rank: int | None = typer.Option(None, "--rank", help="Compare only this rank."),
    step: int | None = typer.Option(None, "--step", help="Compare only this step."),
    top: int = typer.Option(10, "--top", help="Rows in the top-N table by error."),
    tolerance_dtype: str = typer.Option(
        "auto",
        "--tolerance-dtype",
        help="auto: judge each record by the less precise side's compute precision (a bf16 "
        "or emu:bf16 run as bf16); golden: hold the run to the golden's precision; or a "
        "dtype name (bfloat16, float32, ...).",
    ),
    rename: list[str] = typer.Option(
        [],
        "--map",
        help="OLD=NEW: modules named OLD (a glob; a leading part of the name up to a dot) "
        "are called NEW, '*' in NEW repeating OLD's, e.g. 'blocks.*=layers.*'. Repeatable; "
        "applied to both sides after wrapper prefixes (DDP 'module.', FSDP, torch.compile, "
        "checkpointing) are stripped.",
        metavar="OLD=NEW",
    ),
    layout: str | None = typer.Option(
        None,
        "--layout",
        help="Layout spec (YAML file, or a shipped one: megatron, megatron-sp, llama, "
        "column-row, fsdp2) of a "
        "tensor-/pipeline-parallel recording: its shards are gathered into whole tensors "
        "and compared with a single-device golden; the first divergence names the rank "
        "whose shard holds the error. See docs/layouts.md.",
        metavar="SPEC",
    ),
    replay: bool = typer.Option(
        False,
        "--replay",
        help="Re-run each failing module (first divergence, then suspects) alone on the "
        "actual's device with the golden's recorded inputs: its local error measured "
        "directly, shown beside the inferred one. Needs full tensors and --target.",
    ),
    replay_top: int = typer.Option(
        3, "--replay-top", help="With --replay: how many failing modules to replay."
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        "-t",
        help="The target whose code ran on the actual's side (never taken from a recording "
        "implicitly): --replay re-runs the failing modules with it, and a divergence gets "
        "each local finding's impact on the output error (docs/impact.md).",
    ),
    device: str | None = typer.Option(
        None,
        "--device",
        "-d",
        help="With --target: the device to re-run the actual side on (default: the actual "
        "recording's device).",
    ),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="With --target: apply each finding's mechanical remedy to the actual side "
        "(module at reference precision, float32 statistics, float32 buffers, a plugin's "
        "device switch) and re-run: verified, not needed, partial or did not help, against the "
        "floor of a correct run (docs/impact.md).",
    ),
    workers: int = typer.Option(
        1,
        "--workers",
        "-w",
        help="Processes comparing (rank, step) units in parallel; the result is the same "
        "as with one. Across machines: torchrun ... -m precguard.compare (docs/distributed.md).",
    ),
    calibration: Path | None = typer.Option(
        None,
        "--calibration",
        help="A second golden recording: the golden's code at its own precision with its "
        "inputs perturbed by one unit roundoff (TTrace's calibration pass, "
        "compare/calibrate.py perturb_inputs); raises each record's expected error to the "
        "sensitivity it measures.",
    ),
    allow_partial: bool = typer.Option(
        False,
        "--allow-partial",
        help="Exit 0 on a match that covers only part of the recordings (steps or phases "
        "one side lacks, an unfinished run); the gaps are still printed.",
    ),
    bitwise: bool = typer.Option(
        False,
        "--bitwise",
        help="Moved to `precguard bitwise GOLDEN ACTUAL`; this spelling still runs it.",
    ),
) -> None:
    if bitwise:
        given = {"--html": html_out, "--csv": csv_out, "--layout": layout, "--map": rename}
        given |= {"--junit-xml": junit_out}
        given |= {"--replay": replay, "--target": target, "--rtol": rtol, "--atol": atol}
        given |= {"--verify": verify, "--device": device}
        ignored = [name for name, value in given.items() if value]
        if ignored:
            from precguard.errors import UsageError

            raise UsageError(
                f"--bitwise (now `precguard bitwise`) compares hashes only; it takes --json, "
                f"--rank and --step, not "
                f"{', '.join(ignored)}"
            )
        from precguard.cli.bitwise import run_bitwise

        moved = "note: compare --bitwise is now `precguard bitwise`"
        run_bitwise(golden, actual, rank=rank, step=step, json_out=json_out, note=moved)
        return

    from rich.console import Console
    from rich.progress import Progress

    from precguard.compare.options import CompareOptions
    from precguard.compare.render import render
    from precguard.errors import UsageError
    from precguard.layout.compare import compare_runs as run_compare

    options = CompareOptions(
        profile=profile,
        rtol=rtol,
        atol=atol,
        rank=rank,
        step=step,
        tolerance_dtype=tolerance_dtype,
        rename=tuple(rename),
        workers=workers,
        calibration=calibration,
    )
    if top < 0:
        raise UsageError(f"--top must be >= 0, got {top}")
    if replay_top < 1:
        raise UsageError(f"--replay-top must be >= 1, got {replay_top}")
    if replay and target is None:
        from precguard.compare.hints import replay_suggestion
        from precguard.compare.runs import open_side

        raise UsageError(replay_suggestion(open_side(actual).run.manifest.target))
    if replay and layout is not None:
        raise UsageError(
            "--replay cannot be used with --layout: a sharded module runs only inside its "
            "process group (see docs/layouts.md)"
        )
    if (verify or device is not None) and target is None:
        raise UsageError(
            f"{'--verify' if verify else '--device'} re-runs the actual side: it needs --target "
            "(the code the actual side ran)"
        )
    if target is not None and layout is not None:
        raise UsageError(
            "--target cannot be used with --layout: a sharded model runs only inside its "
            "process group (see docs/layouts.md)"
        )
    from precguard.report.page import ensure_writable

    ensure_writable(html=html_out, csv=csv_out, **{"junit-xml": junit_out})
    stderr = Console(stderr=True)
    tty = show_progress()
    with Progress(console=stderr, transient=True, disable=not tty) as bar:
        task = bar.add_task(
            f"comparing {actual} with {golden}",
            total=_steps_to_compare(golden, rank, step) if tty else None,
        )
        result = run_compare(
            golden,
            actual,
            options,
            layout=layout,
            on_step=lambda r, s: bar.update(task, advance=1, description=f"rank {r} step {s}"),
        )
    if replay:
        from precguard.localize.confirm import replay_suspects

        assert target is not None
        result = replay_suspects(result, target=target, top=replay_top)
    if target is not None and result.verdict != "match":
        from precguard.localize.impact import comparison_sides
        from precguard.localize.verify import measure_comparison

        # the sides the recordings ran, the --target's code on each (--device: elsewhere)
        golden_side, actual_side = comparison_sides(result, target, device=device)
        result = measure_comparison(result, actual_side, golden=golden_side, verify=verify)
    if html_out is not None or csv_out is not None:
        from precguard.report.comparison import write_comparison_reports

        write_comparison_reports(result, html=html_out, csv=csv_out, golden=golden, actual=actual)
    if junit_out is not None:
        from precguard.report.junit import comparison_junit, write_junit

        write_junit(junit_out, comparison_junit(result, allow_partial=allow_partial))
    if json_out is not None and str(json_out) == "-":
        _write_comparison(None, result)
    else:
        if json_out is not None:
            _write_comparison(json_out, result)
        console = Console()
        render(result, console, top=top)
        if replay:
            from precguard.localize.confirm import render_replays

            render_replays(result, console)
        if result.verdict != "match" and layout is None:
            from precguard.localize.impact import recordings_only
            from precguard.localize.impact_render import render_budget

            budget = result.impact or recordings_only(result, reason="no --target was given")
            render_budget(budget, console)
    from precguard.errors import ExitCode

    code = result.exit_code
    if code == ExitCode.INCONCLUSIVE and allow_partial:
        code = ExitCode.PASS
    if code:
        raise typer.Exit(code)


@app.command()
def replay(
    golden: Path = typer.Argument(..., help="Golden recording with full tensors of the module."),
    module: str = typer.Option(..., "--module", "-m", help="Qualified module name to replay."),
    target: str | None = typer.Option(
        None,
        "--target",
        "-t",
        help="Target to build the model from (required: a recording never chooses the code "
        "that runs; the error suggests the one the golden names).",
    ),
    device: str = typer.Option("cpu", "--device", "-d", help="Device to run the module on."),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="dtype to run in (default: the one `precguard record` uses on DEVICE).",
    ),
    call: int = typer.Option(0, "--call", help="Which call of the module (0-based)."),
    step: int = typer.Option(0, "--step", help="Which step's inputs to replay."),
    rank: int = typer.Option(0, "--rank", help="Which rank's inputs to replay."),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="Judge by this fixed tolerance profile instead of the error a correct module "
        "explains at the replay's precision.",
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Write the result as JSON."),
) -> None:
    """Run one module alone on DEVICE with the golden's recorded inputs: its local error.

    The golden must hold full tensors of the module's inputs and outputs
    (record it with --tensors 'NAME' or --tensors '*'). Exit 0 when the module's
    own output is within tolerance, 1 when it is not, 2 on unusable input.
    """
    from rich.console import Console

    from precguard.localize.replay import render_replay, replay_module
    from precguard.target_run import Side

    result = replay_module(
        golden,
        module,
        # no --target: replay_module says which target the golden names
        target=Side(target, device, dtype) if target else None,
        call=call,
        step=step,
        rank=rank,
        profile=profile,
    )
    if json_out is not None:
        _write(json_out, result.model_dump_json(indent=2))
    render_replay(result, Console())
    if result.verdict != "match":
        from precguard.errors import ExitCode

        raise typer.Exit(ExitCode.FAIL)


def _steps_to_compare(golden: Path, rank: int | None, step: int | None) -> int | None:
    """How many (rank, step) pairs the golden holds in scope: the progress bar's total.

    None (an open-ended bar) when the golden cannot be read here; compare
    itself then says why.
    """
    from precguard.compare.coverage import last_step
    from precguard.dump.reader import load_run
    from precguard.errors import PrecguardError

    try:
        run = load_run(golden)
    except PrecguardError:
        return None
    total = 0
    for r in run.ranks if rank is None else [rank]:
        last = last_step(run, r)
        if last is not None:
            total += 1 if step is not None else last + 1
    return total or None


def _write_comparison(path: Path | None, result: Comparison) -> None:
    """Write ``result``'s JSON to ``path`` (None: stdout) a record at a time, not as one string."""
    from precguard.compare.report import write_comparison_json

    if path is None:
        write_comparison_json(result, sys.stdout)
        sys.stdout.write("\n")
        return
    from precguard.dump.atomic import atomic_output

    with atomic_output(path, what="--json") as fh:  # whole or not at all, for a polling reader
        write_comparison_json(result, fh)
        fh.write("\n")


def _write(path: Path, payload: str) -> None:
    from precguard.dump.atomic import write_atomic

    write_atomic(path, payload + "\n", what="--json")
