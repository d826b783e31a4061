"""compare's verdicts in the stacks users run: the real-stacks corpus's fast subset.

The whole corpus and its table: ``benchmarks/realworld.py``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.realstacks.corpus import CORPUS, run_case

pytest.importorskip("peft")

FAST = [case for case in CORPUS if case.fast]


@pytest.mark.parametrize("case", FAST, ids=[case.name for case in FAST])
def test_the_verdict_is_right(case, tmp_path: Path):
    outcome = run_case(case, tmp_path)
    assert outcome.ok, (
        f"{case.name}: {outcome.verdict} (exit {outcome.exit_code}) at {outcome.named}: "
        f"{outcome.text[:600]}"
    )
