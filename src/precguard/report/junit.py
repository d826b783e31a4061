"""JUnit XML of a comparison or a diagnosis: ``compare --junit-xml`` and ``check --junit-xml``.

CI systems (Jenkins, GitLab, GitHub Actions' test reporters, Azure) read the
JUnit XML that Ant and Maven Surefire made common; this writes that shape, with
no timestamps or host names, so the same result gives the same file.

``compare``: one test case per record, named by its key and classed by its
module (so a CI tree groups records by module path); a failing or non-finite
record is a ``<failure>``, the first divergence's saying so; a record with no
counterpart is ``<skipped>``. ``check``: one test case per finding, classed by
its family; ``fail`` is a ``<failure>``, ``error`` an ``<error>``, ``skip``
``<skipped>``, a ``warn`` passes with its summary in ``<system-out>``.

The XML fails (a failure or an error) exactly when the command's exit code is
not 0: a partial comparison (exit 3) and a check run in which nothing produced
a result (exit 3) add one ``<error>`` case saying so.
"""

from __future__ import annotations

import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from precguard.compare.report import Comparison, RecordResult
    from precguard.report.models import Diagnosis

#: characters XML 1.0 cannot carry (a key from a hostile recording may hold them)
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")


def comparison_junit(result: Comparison, *, allow_partial: bool = False) -> str:
    """The JUnit XML of ``result`` (see the module docstring for the mapping)."""
    from precguard.guard.margin import judge_threshold, record_margin

    threshold = judge_threshold(result.profile)

    suite = _suite(
        "precguard compare",
        {
            "golden": result.golden,
            "actual": result.actual,
            "devices": " vs ".join(str(d) for d in result.devices),
            "profile": result.profile,
            "verdict": result.verdict,
            "first_divergence": result.first_divergence.key if result.first_divergence else "",
        },
    )
    several = len({(r.step, r.rank) for r in result.records}) > 1
    first = result.first_divergence
    for record in result.records:
        case = _case(suite, record.module, _record_name(record, several))
        margin = record_margin(record, result.tolerances, threshold)
        if record.status == "missing":
            _add(case, "skipped", "no counterpart in the run under test (only in golden)")
        elif record.status in ("fail", "nonfinite"):
            is_first = first is not None and (first.key, first.step, first.rank) == (
                record.key,
                record.step,
                record.rank,
            )
            _add(
                case,
                "failure",
                _record_message(record, margin, first.reason if is_first and first else None),
                kind="first-divergence" if is_first else record.status,
                text=_record_details(record, margin),
            )
    golden_keys = {r.key for r in result.records}
    for key in result.unmatched.actual_only:
        if key not in golden_keys:
            case = _case(suite, key.rsplit(".", 4)[0] if key.count(".") >= 4 else key, key)
            _add(case, "skipped", "no counterpart in the golden (only in the run under test)")
    coverage = result.coverage
    if result.verdict == "match" and coverage is not None and not coverage.complete:
        case = _case(suite, "precguard", "coverage")
        gaps = "; ".join(coverage.gaps) or "part of the recordings was not compared"
        if allow_partial:
            _add(case, "skipped", f"partial match, allowed: {gaps}")
        else:
            _add(case, "error", f"partial match: {gaps}", kind="inconclusive")
    c = result.counts
    if result.verdict == "match" and c.passed + c.failed + c.nonfinite == 0:
        # a suite of skips (or of nothing) reads as green in CI: no record compared is no pass
        case = _case(suite, "precguard", "compared")
        _add(
            case, "error", "nothing was compared: no record has a counterpart", kind="inconclusive"
        )
    return _document([suite])


def diagnosis_junit(diagnosis: Diagnosis) -> str:
    """The JUnit XML of a checklist run (see the module docstring for the mapping)."""
    suite = _suite(
        f"precguard check {diagnosis.checklist}",
        {
            "checklist": diagnosis.checklist,
            "target": diagnosis.target or "",
            "device": diagnosis.device,
            "reference": diagnosis.reference,
            "verdict": diagnosis.verdict,
        },
    )
    for f in diagnosis.findings:
        case = _case(suite, f"precguard.check.{f.family}", f.id, diagnosis.durations.get(f.id))
        details = _finding_details(f.evidence, f.remedy)
        if f.status == "fail":
            _add(case, "failure", f.summary, kind="fail", text=details)
        elif f.status == "error":
            _add(case, "error", f.summary, kind="error", text=details)
        elif f.status == "skip":
            _add(case, "skipped", f.summary)
        elif f.status == "warn":
            ET.SubElement(case, "system-out").text = _clean(f"warn: {f.summary}\n{details}")
    if diagnosis.verdict == "inconclusive":
        case = _case(suite, "precguard.check", "verdict")
        _add(case, "error", "inconclusive: no check produced a result", kind="inconclusive")
    return _document([suite])


def write_junit(path: Path, xml: str) -> Path:
    """Write ``xml`` to ``path`` (``--junit-xml``); a path that cannot be written: exit 2."""
    from precguard.report.page import write_page

    return write_page(path, xml, what="--junit-xml")


# -- building the document -------------------------------------------------------------


def _suite(name: str, properties: dict[str, str]) -> ET.Element:
    suite = ET.Element("testsuite", {"name": _clean(name)})
    props = ET.SubElement(suite, "properties")
    for key, value in properties.items():
        ET.SubElement(props, "property", {"name": key, "value": _clean(str(value))})
    return suite


def _case(suite: ET.Element, classname: str, name: str, time: float | None = None) -> ET.Element:
    attrs = {"classname": _clean(classname), "name": _clean(name)}
    if time is not None and math.isfinite(time):
        attrs["time"] = f"{time:.3f}"
    return ET.SubElement(suite, "testcase", attrs)


def _add(case: ET.Element, tag: str, message: str, *, kind: str = "", text: str = "") -> None:
    attrs = {"message": _clean(message)}
    if kind:
        attrs["type"] = kind
    element = ET.SubElement(case, tag, attrs)
    if text:
        element.text = _clean(text)


def _document(suites: list[ET.Element]) -> str:
    root = ET.Element("testsuites", {"name": suites[0].get("name", "precguard")})
    totals = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
    for suite in suites:
        cases = suite.findall("testcase")
        counts = {
            "tests": len(cases),
            "failures": sum(1 for c in cases if c.find("failure") is not None),
            "errors": sum(1 for c in cases if c.find("error") is not None),
            "skipped": sum(1 for c in cases if c.find("skipped") is not None),
        }
        for key, value in counts.items():
            suite.set(key, str(value))
            totals[key] += value
        root.append(suite)
    for key in ("tests", "failures", "errors"):
        root.set(key, str(totals[key]))
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


# -- what a record or finding says -----------------------------------------------------


def _record_name(record: RecordResult, several: bool) -> str:
    if not several:
        return record.key
    return f"{record.key} (step {record.step}, rank {record.rank})"


def _record_message(record: RecordResult, margin: Any, reason: str | None) -> str:
    m = record.metrics
    if m is None:
        return record.status
    level = "statistics" if m.level == "stats" else m.level
    if record.status == "nonfinite":
        text = f"NaN/Inf differ ({m.nan_mismatch} NaN, {m.inf_mismatch} Inf elements)"
    elif margin is not None and margin.allowed is not None:
        text = f"error {m.error:.3g} > allowed {margin.allowed:.3g} ({m.dtype}, {level})"
    else:
        text = f"error {m.error:.3g} ({m.dtype}, {level})"
    if reason:
        return f"first divergence: {text}: {reason}"
    if record.local is False:
        return f"{text}; passed on from upstream"
    return text


def _record_details(record: RecordResult, margin: Any) -> str:
    data: dict[str, Any] = {
        "key": record.key,
        "module": record.module,
        "module_type": record.module_type,
        "step": record.step,
        "rank": record.rank,
        "status": record.status,
        "local": record.local,
        "expected_error": record.expected_error,
        "margin": margin.margin if margin is not None else None,
        "metrics": record.metrics.model_dump(exclude_none=True) if record.metrics else None,
    }
    return json.dumps(data, indent=2, default=str)


def _finding_details(evidence: dict[str, Any], remedy: str) -> str:
    text = json.dumps(evidence, indent=2, default=str) if evidence else ""
    if remedy:
        text = f"remedy: {remedy}\n{text}"
    return text


def _clean(text: str) -> str:
    return _NOT_XML.sub("\ufffd", text)
