"""Across the ranks of one recording: replica agreement, NaN/Inf spread, reduction order.

>>> report = precguard.ranks.check_replicas("runs/ddp")   # doctest: +SKIP
>>> report.verdict                                         # doctest: +SKIP
'disagree'
"""

from __future__ import annotations

from precguard.ranks.analysis import check_replicas
from precguard.ranks.report import RanksReport

__all__ = ["RanksReport", "check_replicas"]
