""" "Did you mean ...?" for names a user types: check ids, devices, emu profiles, modules."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def closest(word: str, choices: Iterable[str], *, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The ``n`` choices most like ``word``, best first (difflib's ratio >= ``cutoff``).

    Case is ignored for the match; the choices come back as spelled.
    """
    by_lower: dict[str, str] = {}
    for choice in choices:
        by_lower.setdefault(choice.lower(), choice)
    found = difflib.get_close_matches(word.lower(), list(by_lower), n=n, cutoff=cutoff)
    return [by_lower[f] for f in found]


def did_you_mean(word: str, choices: Iterable[str], *, n: int = 3) -> str:
    """``" (did you mean 'x'?)"``, or ``""`` when nothing is close; for error messages.

    >>> did_you_mean("nrom.extreme_inputs", ["norm.extreme_inputs", "rope.angles"])
    " (did you mean 'norm.extreme_inputs'?)"
    """
    found = closest(word, choices, n=n)
    if not found:
        return ""
    return " (did you mean " + " or ".join(repr(f) for f in found) + "?)"
