"""Tests go through the public API where they test behaviour: internal imports can only go down.

Public (not counted): ``precguard`` itself (its lazy exports, ``precguard.__all__``);
``precguard.compare`` (the subpackage: ``compare_runs``, ``CompareOptions``, ``Comparison``,
``RecordResult``, ``Metrics``, ``FirstDivergence``, ``Profile``, ``get_profile``...);
``precguard.cli`` (the ``precguard`` console script, ``precguard.cli:main``, and its typer
``app``); ``precguard.testing`` and ``precguard.pytest_plugin`` (docs/guard.md);
``precguard.targets`` (the built-in targets, docs/targets.md: ``tiny-llama`` is
``precguard.targets:tiny_llama``, with the model and batch builders behind each built-in
target: ``build_tiny_llama``, ``build_handwritten_llama``, ``build_parallel_decoder``...);
``precguard.training.hf`` (docs/watch.md), ``precguard.oracle`` (docs/checklist.md) and
``precguard.checks`` (the package: ``Check``, ``CheckContext``, ``Finding``, ``finding`` for
plugins); ``precguard.layout`` (``LayoutSpec``, ``compare_layout``: docs/layouts.md);
``precguard.plugins`` (``get_backend``: docs/plugins.md); ``precguard.interop.msprobe``
(``open_recording``: docs/msprobe.md).

Everything else (``precguard.compare.metrics``, ``precguard.dump.writer``...) is internal: a unit
test of that algorithm may import it; a test of a user's story should not need to. What
remains is mostly such unit tests: the statistics kernels (capture.stats), the error
measures and expected-error formulas (compare.metrics, expected, tolerance, sampled,
numerics), alignment, the golden and margin files of the pytest plugin, the watch's
detectors, the op-graph model; and fault injection into internals (a writer that fails
mid-record, a hook that raises) that no public call can plant.
"""

from __future__ import annotations

import re
from pathlib import Path

PUBLIC_MODULES = frozenset(
    {
        "precguard.compare",
        "precguard.cli",
        "precguard.testing",
        "precguard.pytest_plugin",
        "precguard.targets",
        "precguard.training.hf",
        "precguard.oracle",
        "precguard.checks",
        "precguard.layout",
        "precguard.plugins",
        "precguard.interop.msprobe",
    }
)

#: the count reached when this test was written (309 before, 182 after moving tests of a
#: user's story to the public API, 146 after the second pass: the figure issue 30 asked
#: for, its 292 halved); lower it when you remove more. Raised once, to 150, by issues
#: 38-41's unit tests of new internals that no public call reaches: the fp8 quantizer
#: (emu/test_emu_fp8.py, the fp8 calibration corpus: backends.emu), the host-sync count of
#: the statistics buffer (capture/test_device_syncs.py: capture.stats), the stored
#: allowed error that guard reads (compare/test_compare_expected_judge.py: guard.margin)
#: and generate-diff's replay filter (capture/test_nonfinite.py: generation.layerwise);
#: the rule protocol its tests use is public (precguard.compare) rather than counted
CEILING = 150

_IMPORT = re.compile(
    r"^\s*(?:from (precguard\.[a-z_.]+) import|import (precguard\.[a-z_.]+))", re.M
)
_TESTS = Path(__file__).resolve().parent


def internal_imports() -> list[str]:
    """Every ``file: module`` line in tests/ that imports a module outside PUBLIC_MODULES."""
    found = []
    for path in sorted(_TESTS.rglob("*.py")):
        for match in _IMPORT.finditer(path.read_text(encoding="utf-8")):
            module = match.group(1) or match.group(2)
            if module not in PUBLIC_MODULES:
                found.append(f"{path.relative_to(_TESTS)}: {module}")
    return found


def test_the_counter_sees_an_internal_import_and_skips_a_public_one() -> None:
    text = "from precguard.dump.writer import X\nfrom precguard.compare import Y\n"
    modules = [m.group(1) or m.group(2) for m in _IMPORT.finditer(text)]
    assert [m for m in modules if m not in PUBLIC_MODULES] == ["precguard.dump.writer"]


def test_internal_imports_in_tests_only_go_down() -> None:
    found = internal_imports()
    assert len(found) <= CEILING, (
        f"{len(found)} internal imports in tests/ (ceiling {CEILING}): a test of behaviour goes "
        "through the public API (precguard.X); export what a user needs too. They are:\n"
        + "\n".join(found)
    )
