"""Every document the code and the docs cite exists.

A reader sent to ``docs/compare.md`` (or to a design note) from a docstring must find
it: a citation of a page that was never written, or was renamed, is worse than none.
The scan covers the package, the plugins, the examples, the benchmarks, the tests and
the docs themselves.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("src", "plugins", "examples", "benchmarks", "tests", "docs", "README.md")
#: ``docs/compare.md``, or a bare page name such as ``DESIGN.md`` (looked up in docs/ and
#: at the root, where the repository's own pages are)
CITATION = re.compile(r"(?<![\w/.-])((?:docs/)?[A-Za-z][\w.-]*\.md)\b")
#: names that are not citations of this repository's pages: the user's own notes beside a
#: golden (the guard leaves a NOTES.md there alone)
NOT_CITATIONS = {"NOTES.md"}


def cited_pages(text: str) -> set[str]:
    """The markdown pages ``text`` names."""
    return set(CITATION.findall(text)) - NOT_CITATIONS


def _exists(page: str, source: Path) -> bool:
    name = page.removeprefix("docs/")
    return any(p.is_file() for p in (ROOT / "docs" / name, ROOT / page, source.parent / page))


def _sources() -> list[Path]:
    found = []
    for entry in SCANNED:
        path = ROOT / entry
        if path.is_file():
            found.append(path)
        else:
            found += sorted(path.rglob("*.py")) + sorted(path.rglob("*.md"))
    return [p for p in found if p.name != Path(__file__).name]


def test_every_cited_document_exists() -> None:
    missing = [
        f"{path.relative_to(ROOT)}: {page}"
        for path in _sources()
        for page in sorted(cited_pages(path.read_text(encoding="utf-8")))
        if not _exists(page, path)
    ]
    assert not missing, "cited documents that do not exist:\n" + "\n".join(missing)


def test_a_citation_of_a_missing_design_document_is_found() -> None:
    """The scan sees what it must: the citation the numerics core once carried."""
    assert cited_pages("accumulate in fp32 (DESIGN.md), so") == {"DESIGN.md"}
    assert cited_pages("see docs/compare.md, 'Sampling uncertainty'") == {"docs/compare.md"}
    assert not _exists("DESIGN.md", ROOT / "src" / "precguard" / "numerics.py")
