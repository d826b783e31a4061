"""Tensor- and pipeline-parallel layouts: gather a parallel recording into whole tensors.

``compare GOLDEN ACTUAL --layout SPEC`` (:func:`precguard.compare_runs` with
``layout=``, which is :func:`compare_layout`) compares a sharded run with a
single-device golden. The spec (:class:`LayoutSpec`, YAML) says how each
module's tensors are split; :func:`gather_run` writes the one-rank view;
:class:`LayoutViews` maps the comparison back onto ranks. See docs/layouts.md.
"""

from __future__ import annotations

from precguard.layout.combine import concat_stats, sum_partials, tensor_stats
from precguard.layout.compare import compare_layout, gathered
from precguard.layout.gather import Gathered, gather_run
from precguard.layout.spec import LayoutSpec, ModuleRule, Shard, builtin_layouts, load_layout
from precguard.layout.view import LayoutViews

__all__ = [
    "Gathered",
    "LayoutSpec",
    "LayoutViews",
    "ModuleRule",
    "Shard",
    "builtin_layouts",
    "compare_layout",
    "concat_stats",
    "gather_run",
    "gathered",
    "load_layout",
    "sum_partials",
    "tensor_stats",
]
