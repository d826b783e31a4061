"""Compare two recordings: align records, measure error, name the layer that introduced it.

>>> result = precguard.compare("runs/golden", "runs/actual")   # doctest: +SKIP
>>> result.verdict                                              # doctest: +SKIP
'diverged'
"""

from __future__ import annotations

import sys
import types
from typing import Any

from precguard.compare.engine import IncomparableRunsError, compare, fingerprint_diff
from precguard.compare.report import Comparison, FirstDivergence, Metrics, RecordResult
from precguard.compare.tolerance import PROFILES, Profile, get_profile

__all__ = [
    "PROFILES",
    "Comparison",
    "FirstDivergence",
    "IncomparableRunsError",
    "Metrics",
    "Profile",
    "RecordResult",
    "compare",
    "fingerprint_diff",
    "get_profile",
]


class _CallableModule(types.ModuleType):
    """Lets ``precguard.compare(...)`` work once this subpackage has been imported.

    Importing ``precguard.compare`` binds the subpackage to the attribute the
    public function ``precguard.compare`` lives under; making the module callable
    keeps both spellings working whatever was imported first.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Comparison:
        return compare(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
