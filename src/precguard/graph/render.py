"""Render a :class:`GraphDiff`: terminal text and a standalone HTML page, grouped by module."""

from __future__ import annotations

import html

from precguard.graph.diff import GraphDiff, OpDifference
from precguard.text import shown


def by_module(diff: GraphDiff) -> list[tuple[str, list[OpDifference]]]:
    """The differences grouped by module, modules in the rank of their first difference."""
    groups: dict[str, list[OpDifference]] = {}
    for d in diff.differences:
        groups.setdefault(d.module, []).append(d)
    return list(groups.items())


def render_text(diff: GraphDiff, *, max_modules: int = 20) -> str:
    """The diff as text: a summary line, then each module's differences, highest impact first."""
    head = (
        f"graph diff ({diff.level} level): golden {shown(diff.golden)} ({diff.golden_ops} ops) "
        f"vs actual {shown(diff.actual)} ({diff.actual_ops} ops), "
        f"{diff.modules_compared} modules"
    )
    if diff.verdict == "same":
        return head + "\nsame ops, dtypes, shapes and devices in every module\n"
    groups = by_module(diff)
    lines = [head, f"{len(diff.differences)} differences in {len(groups)} modules:"]
    for module, diffs in groups[:max_modules]:
        lines.append(f"  {shown(module)}")
        for d in diffs:
            times = f" (x{d.count})" if d.count > 1 else ""
            lines.append(f"    {d.kind:<11} {shown(d.message, 200)}{times}")
    if len(groups) > max_modules:
        lines.append(f"  ... {len(groups) - max_modules} more modules (see --json)")
    return "\n".join(lines) + "\n"


def render_html(diff: GraphDiff) -> str:
    """The diff as one self-contained HTML page (no scripts, nothing fetched)."""
    esc = html.escape
    rows = []
    for module, diffs in by_module(diff):
        rows.append(f'<tr class="module"><th colspan="4">{esc(module)}</th></tr>')
        for d in diffs:
            rows.append(
                f"<tr><td>{esc(d.kind)}</td><td>{esc(d.message)}</td>"
                f"<td>{d.count}</td><td>{d.impact:.3g}</td></tr>"
            )
    body = (
        "<table><tr><th>kind</th><th>difference</th><th>calls</th><th>impact</th></tr>"
        + "".join(rows)
        + "</table>"
        if rows
        else "<p>Same ops, dtypes, shapes and devices in every module.</p>"
    )
    return (
        "<!doctype html><html><head><meta charset='utf-8'><title>precguard graph diff</title>"
        "<style>body{font-family:sans-serif}td,th{padding:2px 8px;text-align:left}"
        "tr.module th{background:#eee;padding-top:8px}</style></head><body>"
        f"<h1>graph diff ({esc(diff.level)} level)</h1>"
        f"<p>golden {esc(diff.golden)} ({diff.golden_ops} ops) vs actual {esc(diff.actual)} "
        f"({diff.actual_ops} ops): {esc(diff.verdict)}</p>{body}</body></html>\n"
    )
