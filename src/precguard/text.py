"""Show a string that came from a recording (or any untrusted source) on a terminal.

A recording is written by someone else: its device name, module names, keys,
fingerprint and file names may hold terminal escape sequences, newlines, bidi
overrides, rich markup (``[/]``, ``[link=...]``) or a megabyte of text.
:func:`shown` is the one place that makes such a value safe to print: every
character Python does not call printable is written as an escape (``\\x1b``,
``\\n``, ``\\u202e``), the result is cut to ``limit`` characters, and with
``markup=True`` rich markup is escaped so that rich prints the text as it is.

Use it at every print site for a value read from a recording; values built by
precguard itself (numbers, statuses) need nothing.
"""

from __future__ import annotations

#: default cut for one value in a message
LIMIT = 120


def shown(value: object, limit: int = LIMIT, *, markup: bool = False) -> str:
    """``value`` as a one-line, printable string of at most about ``limit`` characters.

    :param value: any object; ``str(value)`` is shown.
    :param limit: longest text kept; a longer one ends in ``…(+N chars)``.
    :param markup: also escape rich markup, for ``console.print`` and table cells.

    >>> shown("cuda\\x1b[2J")
    'cuda\\\\x1b[2J'
    >>> shown("x" * 500, 10)
    'xxxxxxxxxx…(+490 chars)'
    """
    text = value if isinstance(value, str) else str(value)
    extra = len(text) - limit
    if extra > 0:
        text = text[:limit]
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else _escape(ch) for ch in text)
        if len(text) > limit:
            extra = max(extra, 0) + len(text) - limit
            text = text[:limit]
    if extra > 0:
        text += f"…(+{extra} chars)"
    if markup:
        from rich.markup import escape

        text = escape(text)  # also doubles a trailing backslash
    return text


def _escape(ch: str) -> str:
    code = ord(ch)
    if ch == "\n":
        return "\\n"
    if ch == "\t":
        return "\\t"
    if ch == "\r":
        return "\\r"
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


__all__ = ["LIMIT", "shown"]
