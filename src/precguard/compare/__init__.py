"""Compare two recordings: align records, measure error, name the layer that introduced it.

The function is :func:`compare_runs` (``precguard.compare_runs``), told how to compare by one
:class:`CompareOptions`. A new judging rule (compare/rules.py) is written against :class:`Rule`
(or :class:`BaseRule`), settles a record with a :class:`Settlement` and is exercised with
:func:`judge_unit` (docs/architecture.md, "Where to add a rule").

>>> result = precguard.compare_runs("runs/golden", "runs/actual")   # doctest: +SKIP
>>> result.verdict                                                   # doctest: +SKIP
'diverged'
"""

from __future__ import annotations

from precguard.compare.advice import Advice, candidates, chosen
from precguard.compare.coverage import SameRecordingError
from precguard.compare.engine import IncomparableRunsError, fingerprint_diff
from precguard.compare.impact_report import ErrorBudget, RemedyCheck
from precguard.compare.jobs import job
from precguard.compare.levels import (
    ExactMetrics,
    FullMetrics,
    MeasuredMetrics,
    MetricsBase,
    StatsMetrics,
    UnmeasuredMetrics,
    metrics_of,
    metrics_with,
)
from precguard.compare.options import CompareOptions
from precguard.compare.report import (
    Comparison,
    Counts,
    FirstDivergence,
    Metrics,
    RecordIdentity,
    RecordResult,
    Suspect,
)
from precguard.compare.rule import BaseRule, Pass, Rule, Settlement, StepContext
from precguard.compare.runs import compare_recordings, compare_runs
from precguard.compare.tolerance import PROFILES, Profile, get_profile
from precguard.compare.verdict import judge_unit

__all__ = [
    "PROFILES",
    "Advice",
    "BaseRule",
    "CompareOptions",
    "Comparison",
    "Counts",
    "ErrorBudget",
    "ExactMetrics",
    "FirstDivergence",
    "FullMetrics",
    "IncomparableRunsError",
    "MeasuredMetrics",
    "Metrics",
    "MetricsBase",
    "Pass",
    "Profile",
    "RecordIdentity",
    "RecordResult",
    "RemedyCheck",
    "Rule",
    "SameRecordingError",
    "Settlement",
    "StatsMetrics",
    "StepContext",
    "Suspect",
    "UnmeasuredMetrics",
    "candidates",
    "chosen",
    "compare_recordings",
    "compare_runs",
    "fingerprint_diff",
    "get_profile",
    "job",
    "judge_unit",
    "metrics_of",
    "metrics_with",
]
