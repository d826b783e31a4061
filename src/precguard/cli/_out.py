"""What every command says about the files it writes: one ``wrote PATH`` line on stderr."""

from __future__ import annotations

import sys
from pathlib import Path

from precguard.text import shown


def wrote(path: Path | str, what: str = "") -> None:
    """Announce a file a command wrote (``wrote report.html``), on stderr, terminal-safe.

    ``-`` (stdout) is not a file and is not announced.
    """
    if str(path) == "-":
        return
    print(f"wrote {shown(path, 400)}" + (f" ({what})" if what else ""), file=sys.stderr)


def write_json(path: Path, payload: str, what: str = "--json") -> None:
    """Write ``payload`` to ``path`` whole or not at all, and announce it."""
    from precguard.dump.atomic import write_atomic

    write_atomic(path, payload + "\n", what=what)
    wrote(path)


__all__ = ["write_json", "wrote"]
