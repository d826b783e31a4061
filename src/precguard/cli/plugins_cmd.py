"""``precguard plugins`` and ``precguard env``: what is installed, and what the device is set to."""

from __future__ import annotations

import json

import typer

from precguard.cli._app import app


@app.command()
def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List every plugin: name, version, device types it claims, hooks it implements.

    ``--json`` also lists the check ids each plugin registers.

    Plugins that failed to load are listed with the cause; the others still work.
    """
    from precguard import plugins as plugin_manager

    info = plugin_manager.describe()
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    rows = []
    for p in info["plugins"]:
        origin = "built-in" if p["builtin"] else (p["distribution"] or p["module"])
        rows.append(
            (
                p["name"],
                f"{origin} {p['version'] or ''}".strip(),
                ", ".join(p["device_types"]) or "-",
                ", ".join(h.removeprefix("precguard_") for h in p["hooks"]),
            )
        )
    header = ("plugin", "from", "devices", "hooks")
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(3)]
    for row in [header, *rows]:
        typer.echo(
            "  ".join(c.ljust(w) for c, w in zip(row[:3], widths, strict=True)) + "  " + row[3]
        )
    for p in info["plugins"]:
        for warning in p["warnings"]:
            typer.echo(f"warning: plugin {p['name']}: {warning}")
    for err in info["load_errors"]:
        typer.echo(f"failed: plugin {err['name']} could not be loaded: {err['cause']}")


@app.command()
def env(
    device: str = typer.Option("cpu", "--device", "-d", help="cpu, cuda[:N], npu, emu:PROFILE…"),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of lines."),
) -> None:
    """Print the environment fingerprint of a device: versions, and every flag and
    environment variable that changes numerics there.

    Works without the device's SDK (it then shows the environment variables and
    why the device is unavailable). The same facts go into each recording's manifest.
    """
    from precguard import plugins as plugin_manager
    from precguard.devices import find_backend

    backend = find_backend(device)
    usable, reason = backend.availability()
    facts = plugin_manager.fingerprint(device)
    if as_json:
        doc = {
            "schema_version": 1,
            "device": device,
            "available": usable,
            "reason": reason or None,
            "fingerprint": facts,
        }
        typer.echo(json.dumps(doc, indent=2, default=str))
        return
    typer.echo(f"device: {device} ({'available' if usable else 'unavailable: ' + reason})")
    width = max((len(k) for k in facts), default=0)
    for key, value in facts.items():
        shown = "(unset)" if value is None and key.startswith("env.") else value
        typer.echo(f"{key.ljust(width)}  {shown}")
