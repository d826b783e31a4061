"""``precguard check``: walk a checklist of known failure patterns and print one diagnosis."""

from __future__ import annotations

from pathlib import Path

import typer

from precguard.cli._app import app, show_progress
from precguard.cli._out import print_json, wrote
from precguard.text import safe_console, shown

_HELP = """Run a checklist of known precision failure patterns on a target and diagnose.

Each check runs a few experiments on copies of the target's model, on DEVICE against
REFERENCE: seeding, data order, tokenizer, norms and RoPE against fp64, attention, custom
ops, loss scaling, gradients, the loss, reduction-order noise, and (with --golden) the
first divergent layer against a golden recording. Failures are ranked most likely root
cause first (environment, randomness, data and tokens before numerics).

Checklists: fp8, llama-finetune, llama-inference, quick, serving, or a path to your own YAML.

Exit codes: 0 nothing failed, 1 a check failed (or could not run), 2 unusable input,
3 inconclusive: no check produced a result (all skipped, or none selected).
"""


@app.command(help=_HELP)
def check(
    checklist: str = typer.Option(
        "llama-finetune", "--checklist", "-c", help="Shipped checklist name or a YAML path."
    ),
    target: str = typer.Option(
        "tiny-llama", "--target", "-t", help="Built-in name, path/file.py[:fn] or pkg.mod[:fn]."
    ),
    device: str = typer.Option("cpu", "--device", "-d", help="Device under test: cpu, emu:fp16…"),
    reference: str = typer.Option("cpu", "--reference", help="Trusted reference device."),
    dtype: str | None = typer.Option(
        None,
        "--dtype",
        help="Model dtype on the device: float32, bfloat16 or float16 [default: float32, or "
        "the storage dtype of a mixed-precision emu: profile].",
    ),
    golden: Path | None = typer.Option(
        None, "--golden", help="Golden recording (for layerwise, data and env checks)."
    ),
    only: list[str] = typer.Option(
        [], "--only", help="Run only these check ids, globs or families (repeatable)."
    ),
    skip: list[str] = typer.Option(
        [], "--skip", help="Leave out these check ids, globs or families (repeatable)."
    ),
    json_out: Path | None = typer.Option(
        None, "--json", help="Write the Diagnosis as JSON to this file ('-' for stdout)."
    ),
    html_out: Path | None = typer.Option(None, "--html", help="Write an HTML report here."),
    junit_out: Path | None = typer.Option(
        None,
        "--junit-xml",
        help="Write JUnit XML here for CI: one test case per finding (fail: <failure>, "
        "error: <error>, skip: <skipped>).",
        metavar="FILE",
    ),
    fingerprints_out: Path | None = typer.Option(
        None,
        "--fingerprints-out",
        help="Write the target's data and tokenizer fingerprints (fingerprints.json) into this "
        "directory, e.g. a golden recording, and exit.",
    ),
    verify: bool = typer.Option(
        False,
        "--verify",
        help="Re-run the target with each flagged finding's module at reference precision "
        "and with each mechanical remedy applied: the findings ranked by their share of the "
        "output error, each remedy verified or not (docs/impact.md).",
    ),
    list_checks: bool = typer.Option(
        False, "--list", help="List the registered checks and the shipped checklists, then exit."
    ),
) -> None:
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    from precguard import checklist as cl
    from precguard.report.diagnosis import as_json, render_terminal, write_html
    from precguard.target_run import Side

    # a checklist's, a plugin's and a recording's text is printed: every string terminal-safe
    out = safe_console(highlight=False, soft_wrap=False)
    if list_checks:
        for check_id, chk in sorted(cl.registered_checks().items()):
            typer.echo(f"{shown(check_id):36} {shown(chk.description, 600)}")
        typer.echo(f"\nchecklists: {', '.join(cl.builtin_checklists())}")
        return
    if fingerprints_out is not None:
        from precguard.checks import fingerprints
        from precguard.target import load_target

        path = fingerprints.write(fingerprints_out, load_target(target))
        typer.echo(
            f"wrote the data and tokenizer fingerprints of {shown(target)} to {shown(path, 400)}"
        )
        return
    from precguard.report.page import ensure_writable

    ensure_writable(html=html_out, **{"junit-xml": junit_out})
    # --target/--device/--dtype: the device under test; --reference: the same target there,
    # in float32 (the checks' reference and the golden --verify re-runs against)
    actual = Side(target, device, dtype)
    reference_side = Side(target, reference, "float32")
    err = safe_console(stderr=True)
    progress = Progress(
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
        console=err,
        transient=True,
        disable=not show_progress(),
    )
    with progress:
        task = progress.add_task(shown(f"{checklist} on {device}", markup=True), total=None)

        def on_progress(check_id: str, index: int, total: int) -> None:
            progress.update(
                task, total=total, completed=index, description=shown(check_id, markup=True)
            )

        diagnosis = cl.check(
            checklist,
            actual,
            reference=reference_side,
            golden=golden,
            only=only,
            skip=skip,
            on_progress=on_progress,
        )
    if verify and diagnosis.verdict == "fail":
        from precguard.localize.verify import verify as verify_findings

        budget = verify_findings(diagnosis.root_causes, actual, golden=reference_side)
        diagnosis = diagnosis.model_copy(update={"impact": budget})
    if json_out is not None:
        if str(json_out) == "-":
            print_json(as_json(diagnosis))
        else:
            from precguard.dump.atomic import write_atomic

            write_atomic(json_out, as_json(diagnosis) + "\n", what="--json")
            wrote(json_out)
    if html_out is not None:
        write_html(diagnosis, html_out)
        wrote(html_out)
    if junit_out is not None:
        from precguard.report.junit import diagnosis_junit, write_junit

        write_junit(junit_out, diagnosis_junit(diagnosis))
        wrote(junit_out)
    if json_out is None or str(json_out) != "-":
        render_terminal(diagnosis, out)
        if diagnosis.impact is not None:
            from precguard.localize.impact_render import render_budget

            render_budget(diagnosis.impact, out)
    if diagnosis.exit_code:
        raise typer.Exit(diagnosis.exit_code)
