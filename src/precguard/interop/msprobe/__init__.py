"""msprobe interop: read Huawei MindStudio msprobe dumps as precguard recordings.

>>> from precguard.interop.msprobe import import_msprobe, open_recording
>>> import_msprobe("msprobe_dump", "runs/npu")                 # doctest: +SKIP
>>> precguard.compare_runs("runs/cpu", "msprobe_dump")        # doctest: +SKIP

See docs/msprobe.md for the mapping of msprobe's names and statistics.
"""

from __future__ import annotations

from precguard.interop.msprobe.convert import import_msprobe, open_recording
from precguard.interop.msprobe.layout import find_rank_dumps, is_msprobe_dump
from precguard.interop.msprobe.names import API_NAMESPACE, is_api_key, parse_name

__all__ = [
    "API_NAMESPACE",
    "find_rank_dumps",
    "import_msprobe",
    "is_api_key",
    "is_msprobe_dump",
    "open_recording",
    "parse_name",
]
