"""Generation divergence: the first token where two backends' decoding differs, and why.

:func:`generate_diff` decodes the same prompts on two sides with a KV cache,
finds the first step where the chosen tokens differ, judges it a near-tie or a
real divergence, compares the caches and replays the divergence layer by layer.
"""

from __future__ import annotations

from precguard.generation.api import generate_diff
from precguard.generation.report import GenerationDiff, generation_schema
from precguard.generation.separate import compare_generation_runs, generate_run

__all__ = [
    "GenerationDiff",
    "compare_generation_runs",
    "generate_diff",
    "generate_run",
    "generation_schema",
]
