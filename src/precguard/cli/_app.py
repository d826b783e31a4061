"""The Typer application and the logging set-up every command shares."""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass
from typing import Any

import typer


@dataclass
class _State:
    debug: bool = False


state = _State()

app = typer.Typer(
    name="precguard",
    help="Find where and why a model computes different numbers on one backend than on "
    "a trusted reference.\n\nExit codes: 0 match / checks pass, 1 divergence or failed "
    "check, 2 unusable input, 3 not enough evidence (compare: a match covering only part of "
    "the recordings).",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


class _StructlogFormatter(logging.Formatter):
    """Render precguard's log records with structlog's console or JSON renderer."""

    def __init__(self, json_output: bool) -> None:
        super().__init__()
        import structlog

        self._renderer: Any = (
            structlog.processors.JSONRenderer()
            if json_output
            else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty() and not no_color())
        )

    def format(self, record: logging.LogRecord) -> str:
        from precguard.text import printable

        event = getattr(record, "precguard_event", None) or record.getMessage()
        data = dict(getattr(record, "precguard_data", {}) or {})
        # values may quote a recording: escaped before the renderer adds its own styling
        data = {k: printable(v) if isinstance(v, str) else v for k, v in data.items()}
        event_dict = {"event": printable(str(event)), "level": record.levelname.lower(), **data}
        if record.exc_info and state.debug:
            event_dict["exception"] = self.formatException(record.exc_info)
        return str(self._renderer(None, record.levelname.lower(), event_dict))


def no_color() -> bool:
    """Whether the user asked for no colour: ``NO_COLOR`` set and not empty (no-color.org)."""
    return bool(os.environ.get("NO_COLOR"))


def show_progress() -> bool:
    """Whether to draw progress bars: only on a terminal (stderr), never in CI logs.

    Not with ``NO_COLOR`` either, nor on ``TERM=dumb``: both ask for plain output, and a
    bar redrawn in place is not plain (docs/guard.md).
    """
    return sys.stderr.isatty() and not no_color() and os.environ.get("TERM") != "dumb"


def configure_logging(level: str) -> None:
    """Send precguard's events to stderr as rendered lines (``warning  event key=value``),
    never raw JSON unless asked: ``PRECGUARD_LOG_JSON=1`` writes JSON lines for a log
    collector (docs/report.md). Colour only on a TTY."""
    handler = logging.StreamHandler(sys.stderr)
    json_output = os.environ.get("PRECGUARD_LOG_JSON", "") not in ("", "0")
    handler.setFormatter(_StructlogFormatter(json_output=json_output))
    root = logging.getLogger("precguard")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False


def _print_version(value: bool) -> None:
    if not value:
        return
    from importlib.metadata import version

    from precguard import __version__

    try:
        torch_version = version("torch")
    except Exception:  # torch's metadata missing: say so rather than import it
        torch_version = "not installed"
    typer.echo(f"precguard {__version__} (torch {torch_version})")
    raise typer.Exit()


@app.callback()
def _main(
    version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print precguard's version (and torch's) and exit.",
    ),
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
    log_level: str = typer.Option(
        "warning", "--log-level", help="Log level on stderr: debug, info, warning, error."
    ),
) -> None:
    state.debug = debug
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        from precguard.errors import UsageError

        raise UsageError(f"--log-level: expected debug, info, warning or error, got {log_level!r}")
    configure_logging(log_level)
