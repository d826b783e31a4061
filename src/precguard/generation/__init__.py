"""Generation divergence: the first token where two backends' decoding differs, and why.

:func:`generate_diff` decodes the same prompts on two sides with a KV cache,
finds the first step where the chosen tokens differ, judges it a near-tie or a
real divergence, compares the caches and replays the divergence layer by layer.
"""

from __future__ import annotations

from precguard.generation.api import generate_diff
from precguard.generation.report import GenerationDiff, generation_schema

__all__ = ["GenerationDiff", "generate_diff", "generation_schema"]
