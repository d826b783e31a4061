"""Inline SVG plots for the HTML reports, drawn with matplotlib's SVG backend.

matplotlib is imported here only, when a report is written, so
``import precguard`` and ``precguard --help`` stay fast. Each figure gets
its own ``svg.hashsalt``: several inline SVGs share one page's id namespace,
and colliding clip-path ids would clip one plot with another's rectangle.
Text is kept as text (``svg.fonttype = none``): smaller files, selectable
labels, the page's own font.
"""

from __future__ import annotations

import io
import itertools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from precguard.text import plain_text

if TYPE_CHECKING:
    from matplotlib.figure import Figure

#: a plot of more points than this is drawn as an image embedded in the SVG (axes stay vector)
RASTER_ABOVE = 4000

_serial = itertools.count()


def figure(width: float = 11.0, height: float = 3.6, **kwargs: Any) -> Figure:
    """A new matplotlib figure (no pyplot: no global state, no GUI backend)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained", **kwargs)


def to_svg(fig: Figure) -> str:
    """The figure as an ``<svg>`` element to inline in HTML (no XML prolog, unique ids)."""
    import matplotlib

    with matplotlib.rc_context(
        {"svg.hashsalt": f"precguard-{next(_serial)}", "svg.fonttype": "none"}
    ):
        plain_text(fig)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    start = text.find("<svg")
    return text[start:] if start >= 0 else text


def positive(values: Sequence[float | None], floor: float) -> list[float]:
    """Values for a log axis: non-finite as NaN (not drawn), zero and below at ``floor``."""
    out = []
    for v in values:
        if v is None or not isinstance(v, int | float) or not math.isfinite(v):
            out.append(math.nan)
        else:
            out.append(max(float(v), floor))
    return out


def log_floor(values: Sequence[float | None]) -> float:
    """Where zero is drawn on a log axis: a decade below the smallest positive value."""
    finite = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v) and v > 0]
    return min(finite) / 10 if finite else 1e-12
