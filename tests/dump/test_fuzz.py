"""Fuzz: seeded hostile mutations of a real recording; none may break precguard.

The engine is benchmarks/fuzz_recordings.py (run it for the long tally); here
it runs in-process a fixed number of mutations with a pinned seed, so what is
tested is the same on a fast machine and a loaded one.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
#: the fixed amount of work (seed 14 draws at least 8 kinds of mutation among them)
MUTATIONS = 30


def _engine():
    spec = importlib.util.spec_from_file_location(
        "fuzz_recordings", ROOT / "benchmarks" / "fuzz_recordings.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_hostile_recordings_are_refused_cleanly_or_judged(tmp_path: Path) -> None:
    engine = _engine()

    tally, outcomes = engine.fuzz(tmp_path, mutations=MUTATIONS, seed=14, replay_every=15)

    problems = [f"{o.mutation}: {o.problems[0]}" for o in outcomes if o.problems]
    assert not problems, "\n".join(problems[:10])
    assert tally["internal errors"] == 0 and tally["inconsistent accepted"] == 0
    assert tally["leaks"] == 0
    # every mutation ran, and both ways: refusing what is broken, judging what is not
    assert tally["mutations"] == MUTATIONS, tally
    assert tally["clean refusals"] >= 5 and tally["accepted"] >= 5, tally
    assert len({o.mutation.split(":")[0] for o in outcomes}) >= 8
