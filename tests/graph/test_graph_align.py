"""``graph diff`` aligns thousands of ops per module, and aligns them right.

The alignment (:mod:`precguard.graph.align`, Myers' shortest edit script) is
checked against the longest common subsequence computed the plain way on a fixed
number of random op sequences, and on the sequence that made the former
alignment cubic: one side with an extra op after every op.
"""

from __future__ import annotations

import random

import pytest

from precguard.graph.align import opcodes
from precguard.graph.diff import diff_graphs
from precguard.graph.model import OpGraph, OpNode, TensorMeta

#: random sequence pairs per probe (fixed: the tests do the same work on every machine)
PROBES = 400


def lcs_length(a: list[str], b: list[str]) -> int:
    """The longest common subsequence's length, by the textbook table."""
    row = [0] * (len(b) + 1)
    for x in reversed(a):
        nxt = [0] * (len(b) + 1)
        for j in range(len(b) - 1, -1, -1):
            nxt[j] = row[j + 1] + 1 if x == b[j] else max(row[j], nxt[j + 1])
        row = nxt
    return row[0]


def assert_alignment(a: list[str], b: list[str], ops: list) -> int:
    """``ops`` cover both sequences in order, equal stretches are equal; return the matched."""
    i = j = matched = 0
    previous = None
    for tag, i1, i2, j1, j2 in ops:
        assert (i1, j1) == (i, j)
        if tag == "equal":
            assert a[i1:i2] == b[j1:j2]
            matched += i2 - i1
        else:
            assert (
                tag
                == {(1, 1): "replace", (1, 0): "delete", (0, 1): "insert"}[
                    (int(i2 > i1), int(j2 > j1))
                ]
            )
            assert previous != "non-equal"  # edits between two matches are one opcode
        previous = "equal" if tag == "equal" else "non-equal"
        i, j = i2, j2
    assert (i, j) == (len(a), len(b))
    return matched


def test_the_alignment_is_a_shortest_edit_script():
    rng = random.Random(0)
    for _ in range(PROBES):
        a = [rng.choice(["mm", "add", "to"]) for _ in range(rng.randrange(0, 14))]
        b = [rng.choice(["mm", "add", "to", "rope"]) for _ in range(rng.randrange(0, 14))]
        assert assert_alignment(a, b, opcodes(a, b)) == lcs_length(a, b), (a, b)


def test_past_its_edit_bound_the_alignment_halves_and_stays_whole():
    rng = random.Random(1)
    for _ in range(PROBES):
        a = [rng.choice("abc") for _ in range(rng.randrange(0, 40))]
        b = [rng.choice("abcd") for _ in range(rng.randrange(0, 40))]
        assert_alignment(a, b, opcodes(a, b, max_edits=rng.choice([1, 2, 5])))


def _graph(ops: list[str]) -> OpGraph:
    meta = [TensorMeta(dtype="float32", shape=[4])]
    nodes = [
        OpNode(id=i, op=op, target=f"torch.{op}", module="layer", inputs=meta, outputs=meta)
        for i, op in enumerate(ops)
    ]
    return OpGraph(source="op-trace", level="function", device="cpu", nodes=nodes)


@pytest.mark.parametrize("n", [2000])
def test_a_cast_after_each_of_thousands_of_ops_is_found_in_one_module(n):
    # SequenceMatcher took 40 s for 1,000 ops of this shape and ~6 minutes for 2,000
    golden = ["add"] * n
    actual = [op for _ in range(n) for op in ("add", "to")]
    diff = diff_graphs(_graph(golden), _graph(actual))
    assert diff.verdict == "different"
    [extra] = diff.differences
    assert (extra.kind, extra.actual_ops, extra.count) == ("actual_only", ["to"], n)
    assert "an extra cast" in extra.message
