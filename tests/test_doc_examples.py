"""Every doc example marked ``<!-- doc-example -->`` is run, and its shown output checked.

A marked example is a fenced block of ``$ precguard ...`` commands, each followed by
the output the docs show (``...`` leaves lines out). Each command runs in a scratch
directory (``examples/`` reachable as in the repository) in an 80-column terminal;
each shown line must appear in what it printed, whitespace and panel borders aside
(rich wraps at the terminal's width). So a verdict, a count or a remedy's numbers
that drift fail here; times are never shown in a checked line (issue 39).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARK = "<!-- doc-example -->"


def examples() -> list[tuple[str, int, str]]:
    """(doc, index, block) of every marked example in docs/."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        for i, part in enumerate(text.split(MARK)[1:]):
            block = re.match(r"\s*```[^\n]*\n(.*?)```", part, re.S)
            assert block, f"{doc.name}: {MARK} must be followed by a fenced block"
            found.append((doc.name, i, block.group(1)))
    return found


def _flat(text: str) -> str:
    return " ".join(text.replace("│", " ").split())


def _steps(block: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and line.strip() and line.strip() != "...":
            steps[-1][1].append(line)
    return steps


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every example, in order: a later example reads an earlier's runs."""
    root = tmp_path_factory.mktemp("docs")
    (root / "examples").symlink_to(ROOT / "examples")
    return root


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "index", "block"), examples(), ids=lambda v: str(v)[:20])
def test_the_doc_example_prints_what_it_shows(
    doc: str, index: int, block: str, scratch: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "COLUMNS": "80"}
    env.pop("PRECGUARD_LOG_JSON", None)
    for command, shown in _steps(block):
        argv = shlex.split(command)
        assert argv[0] == "precguard", f"{doc}: only precguard commands run here: {command}"
        out = subprocess.run(
            [sys.executable, "-m", "precguard", *argv[1:]],
            capture_output=True, text=True, cwd=scratch, env=env, check=False,
        )  # fmt: skip
        printed = _flat(out.stdout + out.stderr)
        missing = [line for line in shown if _flat(line) not in printed]
        assert not missing, f"{doc} example {index}: `{command}` printed\n{out.stdout}{out.stderr}"
