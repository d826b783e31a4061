"""The ``precguard`` command line: a thin layer over the API.

Exit codes everywhere: 0 match / all checks pass, 1 divergence or a failed
check, 2 unusable input or usage (one line on stderr; ``--debug`` shows the
traceback), 3 not enough evidence (``compare``: a match that covers only part of
the recordings, see ``compare/coverage.py``).
"""

from __future__ import annotations

import importlib
import os
import sys
import traceback

from precguard.cli._app import app, state
from precguard.text import shown

#: longest error message printed (a message quoting a recording is cut, not echoed whole)
ERROR_LIMIT = 600

#: command modules; each registers its commands on ``app`` when imported
COMMAND_MODULES: tuple[str, ...] = (
    "precguard.cli.record",
    "precguard.cli.schema",
    "precguard.cli.compare",
    "precguard.cli.bitwise",
    "precguard.cli.plugins_cmd",
    "precguard.cli.check",
    "precguard.cli.bisect",
    "precguard.cli.opcheck",
    "precguard.cli.ranks",
    "precguard.cli.msprobe",
    "precguard.cli.report",
    "precguard.cli.generate",
    "precguard.cli.watch",
    "precguard.cli.graph",
)

for _name in COMMAND_MODULES:
    importlib.import_module(_name)


def _click_error() -> type[Exception]:
    """ClickException of the click that typer runs on: its own copy in recent typer
    releases (``typer._click``), click itself in older ones."""
    import typer.core

    click = getattr(typer.core, "_click", None)
    if click is None:
        import click
    return click.exceptions.ClickException


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    import typer

    from precguard.errors import ExitCode, PrecguardError

    click_error = _click_error()

    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("PRECGUARD_DEBUG", "") not in ("", "0")
    try:
        # not standalone: click's usage errors come here, to be said in one safe line
        code = app(args=args, prog_name="precguard", standalone_mode=False)
    except click_error as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # the help is printed already
            sys.exit(exc.exit_code)  # type: ignore[attr-defined]
        # an unknown option or a missing argument quotes what the user typed, which may
        # be a hostile file name: one line through the terminal-safe renderer, exit 2
        ctx = getattr(exc, "ctx", None)
        hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
        message = shown(exc.format_message(), ERROR_LIMIT)  # type: ignore[attr-defined]
        print(f"precguard: error: {message}{hint}", file=sys.stderr)
        sys.exit(exc.exit_code)  # type: ignore[attr-defined]
    except typer.Abort:
        print("precguard: interrupted", file=sys.stderr)
        sys.exit(130)
    except PrecguardError as exc:
        if debug or state.debug:
            traceback.print_exc()
        # one line, whatever the message holds: it may quote a hostile recording
        print(f"precguard: error: {shown(exc, ERROR_LIMIT)}", file=sys.stderr)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        print("precguard: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        debugging = debug or state.debug
        if debugging:
            traceback.print_exc()
        hint = "" if debugging else " (rerun with --debug for the traceback)"
        print(
            f"precguard: internal error: {type(exc).__name__}: {shown(exc, ERROR_LIMIT)}{hint}",
            file=sys.stderr,
        )
        sys.exit(ExitCode.USAGE)
    sys.exit(code if isinstance(code, int) else 0)
