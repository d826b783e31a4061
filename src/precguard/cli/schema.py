"""``precguard schema``: the JSON Schema of the recording format."""

from __future__ import annotations

import json

import typer

from precguard.cli._app import app


@app.command()
def schema(
    which: str = typer.Argument(
        "all", help="manifest, record, status, layout, generation, or all."
    ),
) -> None:
    """Print the JSON Schema of a recording's manifest, records and rank status files, of a
    layout spec, and of the generate-diff report."""
    from precguard.dump.schema import schemas
    from precguard.errors import UsageError
    from precguard.generation.report import generation_schema
    from precguard.layout.spec import layout_schema

    found = schemas() | {"layout": layout_schema(), "generation": generation_schema()}
    if which != "all":
        if which not in found:
            raise UsageError(f"unknown schema {which!r}; expected one of: all, {', '.join(found)}")
        found = found[which]
    typer.echo(json.dumps(found, indent=2))
