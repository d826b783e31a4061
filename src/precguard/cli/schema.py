"""``precguard schema``: the JSON Schema of the recording format."""

from __future__ import annotations

import json

import typer

from precguard.cli._app import app


@app.command()
def schema(
    which: str = typer.Argument("all", help="manifest, record, status, or all."),
) -> None:
    """Print the JSON Schema of the recording's manifest, records and rank status files."""
    from precguard.dump.schema import schemas
    from precguard.errors import UsageError

    found = schemas()
    if which != "all":
        if which not in found:
            raise UsageError(f"unknown schema {which!r}; expected one of: all, {', '.join(found)}")
        found = found[which]
    typer.echo(json.dumps(found, indent=2))
