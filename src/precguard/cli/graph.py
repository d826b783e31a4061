"""``precguard graph export`` and ``precguard graph diff``: which ops ran, in which dtype."""

from __future__ import annotations

from pathlib import Path

import typer

from precguard.cli._app import app

graph_app = typer.Typer(
    help="Op graphs: export a model's op graph on a device; diff two graphs or two "
    "op-level recordings (fused ops, dtype, shape and device changes per module).",
    no_args_is_help=True,
)
app.add_typer(graph_app, name="graph")


@graph_app.command("export")
def export(
    target: str = typer.Option(
        ...,
        "--target",
        "-t",
        help="A built-in name (tiny-llama), path/file.py[:fn] or pkg.mod[:fn].",
    ),
    device: str = typer.Option("cpu", "--device", "-d", help="cpu, cuda[:N], npu, emu:PROFILE…"),
    dtype: str | None = typer.Option(None, "--dtype", help="Model dtype [default: float32]."),
    fmt: str = typer.Option("json", "--format", help="json (precguard's graph) or onnx."),
    out: Path = typer.Option(..., "--out", "-o", help="File to write."),
    source: str = typer.Option(
        "auto",
        "--source",
        help="auto: torch.export, else an op trace of one forward; export; or trace.",
    ),
    level: str = typer.Option(
        "aten", "--level", help="aten (dispatched ops) or function (torch.*, F.*, Tensor methods)."
    ),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace an existing --out file."),
) -> None:
    """Write the op graph of one forward of TARGET on DEVICE: op, dtypes, shapes, module."""
    from precguard.errors import OutputExistsError, UsageError

    if fmt not in ("json", "onnx"):
        raise UsageError(f"--format: expected json or onnx, got {fmt!r}")
    if source not in ("auto", "export", "trace"):
        raise UsageError(f"--source: expected auto, export or trace, got {source!r}")
    if level not in ("aten", "function"):
        raise UsageError(f"--level: expected aten or function, got {level!r}")
    if level == "function" and source == "export":
        raise UsageError("--level function needs --source trace: torch.export sees aten ops only")
    if out.exists() and not overwrite:
        raise OutputExistsError(f"--out {out}: exists; pass --overwrite to replace it")
    if not out.parent.is_dir():
        raise UsageError(f"--out {out}: the folder {out.parent} does not exist")
    if fmt == "onnx":
        _export_onnx(target, device, dtype, out)
        return
    from precguard.graph.cli_support import target_graph

    graph = target_graph(target, device=device, dtype=dtype, prefer=source, level=level)  # type: ignore[arg-type]
    from precguard.dump.atomic import write_atomic

    write_atomic(out, graph.model_dump_json(indent=1) + "\n", what="--out")
    typer.echo(f"{len(graph.nodes)} ops ({graph.source}, {graph.level} level) -> {out}")


def _export_onnx(target: str, device: str, dtype: str | None, out: Path) -> None:
    import importlib.util

    from precguard.errors import UsageError

    if importlib.util.find_spec("onnx") is None:
        raise UsageError(
            "--format onnx needs the onnx package, which is not installed (pip install onnx); "
            "--format json needs nothing more"
        )
    from precguard.graph.cli_support import target_onnx

    target_onnx(target, device=device, dtype=dtype, out=out)
    typer.echo(f"ONNX graph -> {out}")


@graph_app.command("diff")
def diff(
    golden: Path = typer.Argument(..., help="Golden graph file, or a level='op' recording."),
    actual: Path = typer.Argument(..., help="Actual graph file, or a level='op' recording."),
    json_out: Path | None = typer.Option(None, "--json", help="Write the diff as JSON here."),
    html_out: Path | None = typer.Option(None, "--html", help="Write an HTML page here."),
) -> None:
    """Ops on one side only (fusions, decompositions), dtype, shape and device changes.

    Grouped by module, ranked by likely numeric impact. Exit 1 when anything differs,
    0 when nothing does, 2 for unusable input (a recording without op records, graphs
    taken at different levels).
    """
    from precguard.errors import UsageError
    from precguard.graph.build import load_graph
    from precguard.graph.diff import diff_graphs
    from precguard.graph.render import render_html, render_text
    from precguard.report.page import ensure_writable, write_page

    ensure_writable(json=json_out, html=html_out)
    g, a = load_graph(golden), load_graph(actual)
    try:
        result = diff_graphs(g, a, golden_name=str(golden), actual_name=str(actual))
    except ValueError as exc:
        raise UsageError(str(exc)) from exc
    typer.echo(render_text(result), nl=False)
    if json_out is not None:
        write_page(json_out, result.model_dump_json(indent=2) + "\n", "--json")
    if html_out is not None:
        write_page(html_out, render_html(result))
    from precguard.errors import ExitCode

    raise typer.Exit(ExitCode.FAIL if result.verdict == "different" else ExitCode.PASS)
