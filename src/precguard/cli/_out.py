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


def ascii_json(payload: str) -> str:
    """``payload`` (JSON text) with every character past ASCII written as a ``\\u`` escape.

    JSON already escapes C0 controls inside strings; a bidi override, a zero-width
    space or a C1 control from a recording's names would still reach a terminal raw
    when the JSON goes to stdout (``--json -``). Outside strings JSON is ASCII, so
    escaping every other character keeps the text valid JSON with the same value.
    """
    out = []
    for ch in payload:
        code = ord(ch)
        if code < 0x7F:
            out.append(ch)
        elif code < 0x10000:
            out.append(f"\\u{code:04x}")
        else:  # a surrogate pair, as JSON spells a character past the BMP
            code -= 0x10000
            out.append(f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}")
    return "".join(out)


def print_json(payload: str) -> None:
    """Print JSON text on stdout (``--json -``), terminal-safe: see :func:`ascii_json`."""
    sys.stdout.write(ascii_json(payload) + "\n")


__all__ = ["ascii_json", "print_json", "write_json", "wrote"]
