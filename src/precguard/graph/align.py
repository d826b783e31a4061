"""Align two op-name sequences in ``O((N + M) D)``: Myers' diff, for ``graph diff``.

``difflib.SequenceMatcher`` (without its junk heuristic, which would drop the
most frequent ops) looks for the longest common block at every level of its
recursion: on the sequences a model's modules produce (few distinct op names,
one side with an extra op after every op: a cast after each of 1,000 ops) that
is cubic, 40 s for 1,000 ops. Myers' greedy algorithm ("An O(ND) Difference
Algorithm and Its Variations", 1986) finds a shortest edit script in time
proportional to the sequences' length times the number ``D`` of ops inserted or
deleted: linear where the two sides mostly agree, quadratic only where they
share nothing.

The result has :meth:`difflib.SequenceMatcher.get_opcodes`' form: ``equal``
stretches, and between them a ``replace`` (ops on both sides), ``delete``
(golden only) or ``insert`` (actual only).

Where ``D`` would exceed ``max_edits`` (sides that share little, over thousands
of ops), the stretch between the common prefix and suffix is cut in two at the
same fraction of each side and each half aligned on its own: no longer a
shortest script across the cut, but each half's is, and the time stays
``O((N + M) max_edits log(N + M))``.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

Opcode = tuple[str, int, int, int, int]

#: the most edits (ops inserted or deleted) one greedy pass looks for before the
#: stretch is halved: its loop runs ~D^2 / 2 steps, half a million (~0.3 s) at 1,000
MAX_EDITS = 1000


def opcodes(
    golden: Sequence[Hashable], actual: Sequence[Hashable], *, max_edits: int = MAX_EDITS
) -> list[Opcode]:
    """The alignment of ``golden`` and ``actual`` as ``(tag, i1, i2, j1, j2)`` opcodes.

    >>> opcodes(["mm", "add", "softmax"], ["mm", "to", "add", "softmax"])
    [('equal', 0, 1, 0, 1), ('insert', 1, 1, 1, 2), ('equal', 1, 3, 2, 4)]
    """
    ids: dict[Hashable, int] = {}
    a = [ids.setdefault(x, len(ids)) for x in golden]
    b = [ids.setdefault(x, len(ids)) for x in actual]
    blocks: list[tuple[int, int]] = []
    _align(a, 0, len(a), b, 0, len(b), max(1, max_edits), blocks)
    return _to_opcodes(blocks, len(a), len(b))


def _align(
    a: list[int],
    lo_a: int,
    hi_a: int,
    b: list[int],
    lo_b: int,
    hi_b: int,
    max_edits: int,
    blocks: list[tuple[int, int]],
) -> None:
    """Append the matched pairs of ``a[lo_a:hi_a]`` and ``b[lo_b:hi_b]`` to ``blocks``."""
    # the common prefix and suffix cost the greedy loop nothing: trim them first
    while lo_a < hi_a and lo_b < hi_b and a[lo_a] == b[lo_b]:
        blocks.append((lo_a, lo_b))
        lo_a += 1
        lo_b += 1
    suffix = 0
    while (
        hi_a - suffix > lo_a
        and hi_b - suffix > lo_b
        and a[hi_a - suffix - 1] == b[hi_b - suffix - 1]
    ):
        suffix += 1
    end_a, end_b = hi_a - suffix, hi_b - suffix
    pairs = _matches(a[lo_a:end_a], b[lo_b:end_b], max_edits)
    if pairs is not None:
        blocks.extend((i + lo_a, j + lo_b) for i, j in pairs)
    elif end_a - lo_a <= 1 and end_b - lo_b <= 1:
        pass  # one op a side, different (the trimming took equal ones): no match
    else:  # too many edits for one pass: each half on its own
        mid_a, mid_b = (lo_a + end_a) // 2, (lo_b + end_b) // 2
        _align(a, lo_a, mid_a, b, lo_b, mid_b, max_edits, blocks)
        _align(a, mid_a, end_a, b, mid_b, end_b, max_edits, blocks)
    blocks.extend((end_a + t, end_b + t) for t in range(suffix))


def _matches(a: list[int], b: list[int], max_edits: int) -> list[tuple[int, int]] | None:
    """The matched positions ``(i, j)`` of a shortest edit script, or None past ``max_edits``."""
    n, m = len(a), len(b)
    if not n or not m:
        return []
    limit = min(n + m, max_edits)
    offset = limit + 1
    v = [0] * (2 * limit + 3)
    trace: list[list[int]] = []
    for d in range(limit + 1):
        # v[offset + k]: the furthest x reached on diagonal k = x - y with d edits
        trace.append(v[offset - d - 1 : offset + d + 2])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]  # an insertion (a step down)
            else:
                x = v[offset + k - 1] + 1  # a deletion (a step right)
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[offset + k] = x
            if x >= n and y >= m:
                return _backtrack(trace, a, b, d, k)
    return None


def _backtrack(
    trace: list[list[int]], a: list[int], b: list[int], d: int, k: int
) -> list[tuple[int, int]]:
    """The diagonal steps (matches) of the path that reached the end with ``d`` edits."""
    x, y = len(a), len(b)
    pairs: list[tuple[int, int]] = []
    for e in range(d, 0, -1):
        row = trace[e]  # v as it was before step e, for diagonals -e-1 .. e+1
        at = e + 1  # index of diagonal 0 in row

        def reach(kk: int, row: list[int] = row, at: int = at) -> int:
            return row[at + kk]

        if k == -e or (k != e and reach(k - 1) < reach(k + 1)):
            prev_k = k + 1
            prev_x = reach(prev_k)
            prev_y = prev_x - prev_k
            start_x, start_y = prev_x, prev_y + 1  # after the insertion
        else:
            prev_k = k - 1
            prev_x = reach(prev_k)
            prev_y = prev_x - prev_k
            start_x, start_y = prev_x + 1, prev_y  # after the deletion
        while x > start_x and y > start_y:
            x -= 1
            y -= 1
            pairs.append((x, y))
        x, y, k = prev_x, prev_y, prev_k
    while x > 0 and y > 0:  # the snake of d = 0
        x -= 1
        y -= 1
        pairs.append((x, y))
    pairs.reverse()
    return pairs


def _to_opcodes(blocks: list[tuple[int, int]], n: int, m: int) -> list[Opcode]:
    """Matched pairs (in order) as difflib's opcodes."""
    out: list[Opcode] = []
    i = j = 0
    t = 0
    while t <= len(blocks):
        if t < len(blocks):
            bi, bj = blocks[t]
        else:
            bi, bj = n, m
        if i < bi and j < bj:
            out.append(("replace", i, bi, j, bj))
        elif i < bi:
            out.append(("delete", i, bi, j, j))
        elif j < bj:
            out.append(("insert", i, i, j, bj))
        if t == len(blocks):
            break
        run = 1
        while t + run < len(blocks) and blocks[t + run] == (bi + run, bj + run):
            run += 1
        out.append(("equal", bi, bi + run, bj, bj + run))
        i, j = bi + run, bj + run
        t += run
    return out
