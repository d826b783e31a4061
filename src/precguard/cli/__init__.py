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


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    from precguard.errors import ExitCode, PrecguardError

    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args or os.environ.get("PRECGUARD_DEBUG", "") not in ("", "0")
    try:
        app(args=args, prog_name="precguard", standalone_mode=True)
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
