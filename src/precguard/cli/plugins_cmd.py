"""``precguard plugins`` and ``precguard env``: what is installed, and what the device is set to."""

from __future__ import annotations

import json
from typing import Any

import typer

from precguard.cli._app import app
from precguard.cli._out import ascii_json
from precguard.text import shown


def describe() -> dict[str, Any]:
    """What ``precguard plugins --json`` prints: every plugin and every load error.

    Each plugin: its name, built in or not, module, distribution and version
    (pluggy's distribution info of an entry point), the device types and
    check ids it registers, its hooks, and its warnings (a ``hookimpl`` that
    matches no hook). Both registration hooks are asked first, so a plugin
    that breaks there is listed under ``load_errors``.
    """
    from precguard import __version__, plugins

    registered = {kind: plugins.registered(kind) for kind in ("backends", "checks")}
    dists = {id(plugin): dist for plugin, dist in plugins.pm.list_plugin_distributions()}
    entries = []
    for name, plugin in sorted(
        plugins.pm.list_name_plugin(), key=lambda p: (p[0] not in plugins.BUILTINS, p[0])
    ):
        if plugin is None:  # blocked (PRECGUARD_PLUGINS)
            continue
        dist, builtin = dists.get(id(plugin)), name in plugins.BUILTINS
        mine = {
            k: sorted(key for key, e in found.items() if e.plugin == name)
            for k, found in registered.items()
        }
        entries.append(
            {
                "name": name,
                "builtin": builtin,
                "module": getattr(plugin, "__name__", type(plugin).__module__),
                "distribution": dist.metadata["Name"] if dist else "precguard" if builtin else None,
                "version": dist.version if dist else __version__ if builtin else None,
                "device_types": mine["backends"],
                "checks": mine["checks"],
                "hooks": sorted(c.name for c in plugins.pm.get_hookcallers(plugin) or []),
                "warnings": [
                    f"implements unknown hook {hook!r} (a typo, or written for another "
                    "precguard version)"
                    for hook in plugins.unknown_hooks(plugin)
                ],
            }
        )
    errors = [{"name": n, "cause": c} for n, c in sorted(plugins.load_errors.items())]
    return {"schema_version": 1, "plugins": entries, "load_errors": errors}


@app.command()
def plugins(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List every plugin: name, version, device types it claims, hooks it implements.

    ``--json`` also lists the check ids each plugin registers.

    Plugins that failed to load are listed with the cause; the others still work.
    """
    info = describe()
    if as_json:
        typer.echo(ascii_json(json.dumps(info, indent=2)))
        return
    rows = []
    for p in info["plugins"]:
        origin = "built-in" if p["builtin"] else (p["distribution"] or p["module"])
        rows.append(
            (
                shown(p["name"]),
                shown(f"{origin} {p['version'] or ''}".strip()),
                shown(", ".join(p["device_types"]) or "-"),
                shown(", ".join(h.removeprefix("precguard_") for h in p["hooks"]), 600),
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
            typer.echo(f"warning: plugin {shown(p['name'])}: {shown(warning, 600)}")
    for err in info["load_errors"]:  # a third party's text: terminal-safe
        typer.echo(
            f"failed: plugin {shown(err['name'])} could not be loaded: {shown(err['cause'], 600)}"
        )


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
        typer.echo(ascii_json(json.dumps(doc, indent=2, default=str)))
        return
    # the device name is what the user typed, and facts quote environment variables:
    # both go through the terminal-safe renderer
    said = "available" if usable else "unavailable: " + shown(reason, 600)
    typer.echo(f"device: {shown(device)} ({said})")
    width = max((len(k) for k in facts), default=0)
    for key, value in facts.items():
        value = "(unset)" if value is None and key.startswith("env.") else value
        typer.echo(f"{shown(key).ljust(width)}  {shown(value, 600)}")
