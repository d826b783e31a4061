"""Show a string that came from a recording (or any untrusted source) on a terminal.

A recording is written by someone else: its device name, module names, keys,
fingerprint and file names may hold terminal escape sequences, newlines, bidi
overrides, rich markup (``[/]``, ``[link=...]``) or a megabyte of text.
:func:`shown` is the one place that makes such a value safe to print: every
character Python does not call printable is written as an escape (``\\x1b``,
``\\n``, ``\\u202e``), the result is cut to ``limit`` characters, and with
``markup=True`` rich markup is escaped so that rich prints the text as it is.

Use it at every print site for a value read from a recording; values built by
precguard itself (numbers, statuses) need nothing. :func:`printable` escapes
laid-out text (newlines kept); :func:`safe_console` is a rich console that does
so for every string it prints. :func:`plain_text` does the same for a
matplotlib figure: no label from a recording is parsed as mathtext or reaches
matplotlib's font warnings with a control character.
"""

from __future__ import annotations

from typing import Any

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


def printable(text: str) -> str:
    """``text`` with every non-printable character but the newline written as an escape.

    For text that is already laid out in lines (a terminal summary, a figure
    label): what :func:`shown` does to one value, without the cut and keeping
    line breaks.

    >>> printable("a\\x1b[2Jb\\u202e")
    'a\\\\x1b[2Jb\\\\u202e'
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() or ch == "\n" else _escape(ch) for ch in text)


def safe_console(**kwargs: Any) -> Any:
    """A rich ``Console`` that writes every string it is given through :func:`printable`.

    The terminal summaries of ``generate-diff`` and others interpolate text read
    from files someone else wrote (device names, reasons quoting cache entries,
    paths): an ESC, BEL, bidi override or zero-width character among them reaches
    the terminal unless every print site remembers to escape it. This console
    escapes them where each string is rendered (``Console.render_str``: markup is
    printable text, so rich's own styling is untouched), once for every print.
    """
    from rich.console import Console

    class _SafeConsole(Console):
        def render_str(self, text: str, **options: Any) -> Any:
            return super().render_str(printable(text), **options)

    return _SafeConsole(**kwargs)


__all__ = ["LIMIT", "plain_text", "printable", "safe_console", "shown"]


def _printable_formatter(inner: Any) -> Any:
    """A tick formatter writing ``inner``'s labels through :func:`printable`."""
    from matplotlib.ticker import FuncFormatter

    fmt = FuncFormatter(lambda x, pos=None: printable(str(inner(x, pos))))
    fmt.precguard_printable = True  # type: ignore[attr-defined]
    return fmt


def plain_text(fig: Any) -> None:
    """Make every label of ``fig`` that came from a recording plain text, never mathtext.

    Module names, keys and statistics come from recordings, which anyone can
    write: ``$\\frac$`` in a module name would otherwise reach matplotlib's
    mathtext parser (and fail the whole report). Titles, axis labels, legends,
    annotations and tick labels set from strings are made plain; tick labels
    a numeric formatter writes (a log axis' ``10^{-3}``) keep their math.
    """
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter, LogFormatter, ScalarFormatter

    keep: set[int] = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            keep.add(id(axis.offsetText))
            for which, fmt in (
                ("major", axis.get_major_formatter()),
                ("minor", axis.get_minor_formatter()),
            ):
                # asking for them creates the tick labels a draw would (none parsed yet);
                # string labels sit on fixed locators, so the draw adds no others
                labels = axis.get_ticklabels(which=which)
                # only matplotlib's own numeric formatters may write math; labels
                # given as strings (set_xticks(xs, names): a FuncFormatter) may not
                if isinstance(fmt, LogFormatter | ScalarFormatter):
                    keep.update(id(t) for t in labels)
                elif isinstance(fmt, FixedFormatter):  # string labels are drawn from its seq
                    fmt.seq = [printable(str(s)) for s in fmt.seq]
                elif not getattr(fmt, "precguard_printable", False):
                    # a draw formats string labels again (set_xticks(xs, names)): escape there
                    major = which == "major"
                    setter = axis.set_major_formatter if major else axis.set_minor_formatter
                    setter(_printable_formatter(fmt))
    for text in fig.findobj(Text):
        if id(text) not in keep:
            text.set_parse_math(False)
            # an ESC in a label would otherwise reach stderr in matplotlib's own warning
            # ("Glyph 27 (\x1b) missing from font"), and the page as a control character
            label = text.get_text()
            if not label.isprintable():
                text.set_text(printable(label))
