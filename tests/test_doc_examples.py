"""Every doc example marked ``<!-- doc-example -->`` is run, and its shown output checked.

A marked example is a fenced block of ``$ precguard ...`` commands (``$ git ...`` and
``$ echo $?`` too), each followed by the output the docs show (``...`` leaves lines
out; ``>>>`` lines are Python shown beside it). Each command runs in a scratch
directory (``examples/`` reachable as in the repository) in an 80-column terminal;
each shown line must appear in what it printed, whitespace and panel borders aside
(rich wraps at the terminal's width); ``...`` inside a line elides part of it. So a
verdict, a count or a remedy's numbers that drift fail here; wall times (``0.26 s``) are
masked on both sides, so they are never checked (issue 39).

An example whose runs a ``$ precguard`` line cannot make is marked
``<!-- doc-example setup=NAME -->``: it runs in a directory of its own after
``tests/doc_setups.py`` made them as the doc describes (a training script, a two-rank
torchrun on gloo, a git history of goldens, a lock held by another process).

Run: every block in docs/ that shows what a ``$ precguard`` command printed: newcomer.md
(3), generate.md (6), compare.md (5: the softmax-fp16 summary, replay, ``--replay``,
``--map``, the rope bug), bisect.md, impact.md's ``generate-diff --verify``, op-check.md's
length note, recording.md's lock, guard.md's review of a refreshed golden,
distributed.md's ``ranks``, watch.md's ``watch-report`` and ``bitwise``. A block that
shows output without running is marked ``<!-- illustrative: WHY -->`` in the doc, and
the first test here fails on any block that is neither. None is, today. Not checked
here: what ``pytest`` prints in guard.md (tests/guard/test_plugin_project.py runs that
story), blocks that show only commands or only Python, and the README
(tests/test_readme_commands.py).
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests import doc_setups

ROOT = Path(__file__).resolve().parents[1]
#: ``<!-- doc-example -->``, or ``<!-- doc-example setup=NAME -->``: run in a directory
#: of its own that ``doc_setups.SETUPS[NAME]`` prepared (runs a script or torchrun wrote)
MARK = re.compile(r"<!-- doc-example(?: setup=([\w-]+))? -->")
#: a shown example the docs say is not run, and why: ``<!-- illustrative: WHY -->``
ILLUSTRATIVE = re.compile(r"<!-- illustrative: [^>]+ -->")
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)


def examples() -> list[tuple[str, int, str, str | None]]:
    """(doc, index, block, setup) of every marked example in docs/."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        for i, mark in enumerate(MARK.finditer(text)):
            block = re.match(r"\s*```[^\n]*\n(.*?)```", text[mark.end() :], re.S)
            assert block, f"{doc.name}: {mark.group(0)} must be followed by a fenced block"
            found.append((doc.name, i, block.group(1), mark.group(1)))
    return found


def _shows_output(block: str) -> bool:
    """A block with a ``$ precguard`` command and at least one line it printed."""
    steps = _steps(block)
    return any(cmd.startswith("precguard") for cmd, _ in steps) and any(s for _, s in steps)


def test_every_shown_precguard_output_in_the_docs_is_run_or_says_why_not() -> None:
    """A block that shows what ``$ precguard ...`` printed is a doc example (checked
    here) or says in the doc why it is only illustrative."""
    unchecked = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        for fence in FENCE.finditer(text):
            before = text[: fence.start()].rstrip()
            marked = before.endswith("-->") and (
                MARK.search(before[-80:]) or ILLUSTRATIVE.search(before[-400:])
            )
            if _shows_output(fence.group(1)) and not marked:
                unchecked.append(f"{doc.name}:{text[: fence.start()].count(chr(10)) + 1}")
    assert not unchecked, f"shown output neither run nor marked illustrative: {unchecked}"


#: a wall time (``0.26 s``, ``1.93 s per prompt``): never checked, it is the machine's
TIME = re.compile(r"\b\d+(?:\.\d+)?(?:e[-+]?\d+)? s\b")


def _flat(text: str) -> str:
    return " ".join(TIME.sub("<time> s", text.replace("│", " ").replace("┃", " ")).split())


def _appears(line: str, printed: str) -> bool:
    """Whether a shown line is in the flattened output; ``...`` inside it elides text
    (a run-dependent spread such as ``± 6e-10``, or a long quote), in order."""
    at = 0
    for part in _flat(line).split("..."):
        part = part.strip()
        if part:
            found = printed.find(part, at)
            if found < 0:
                return False
            at = found + len(part)
    return True


def _steps(block: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    going_on = False  # the command's last line ended in a backslash
    for line in block.splitlines():
        if going_on:
            steps[-1] = (steps[-1][0][:-1] + " " + line.strip(), [])
        elif line.startswith("$ "):
            steps.append((line[2:].rstrip(), []))
        elif line.startswith((">>> ", "... ")):  # Python shown beside: not output
            continue
        elif steps and line.strip() and line.strip() != "...":
            steps[-1][1].append(line)
        going_on = bool(steps) and not steps[-1][1] and steps[-1][0].endswith("\\")
    return steps


def _directory(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for shared in ("examples", "tests"):  # targets named by path, as from the repository
        (root / shared).symlink_to(ROOT / shared)
    return root


@pytest.fixture(scope="module")
def scratch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every example, in order: a later example reads an earlier's runs."""
    return _directory(tmp_path_factory.mktemp("docs"))


def _run(argv: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``precguard ...`` as a user types it (``git ...`` too, for guard.md's worktree)."""
    assert argv[0] in ("precguard", "git"), f"only precguard and git commands run here: {argv}"
    head = [sys.executable, "-m", "precguard"] if argv[0] == "precguard" else ["git"]
    return subprocess.run([*head, *argv[1:]], capture_output=True, text=True, cwd=cwd, env=env,
                          check=False)  # fmt: skip


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "index", "block", "setup"), examples(), ids=lambda v: str(v)[:20])
def test_the_doc_example_prints_what_it_shows(
    doc: str, index: int, block: str, setup: str | None, scratch: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": f"{ROOT / 'src'}:{ROOT}", "COLUMNS": "80"}
    env.pop("PRECGUARD_LOG_JSON", None)
    here = scratch if setup is None else _directory(scratch / f"{doc}-{index}")
    prepare: Callable[[Path], contextlib.AbstractContextManager[object]] = (
        doc_setups.SETUPS[setup] if setup else lambda _: contextlib.nullcontext()
    )
    with prepare(here):
        last = 0
        for command, shown in _steps(block):
            if command == "echo $?":  # the exit code of the command before
                printed = str(last)
            else:
                out = _run(shlex.split(command, comments=True), here, env)
                last, printed = out.returncode, out.stdout + out.stderr
            missing = [line for line in shown if not _appears(line, _flat(printed))]
            assert not missing, f"{doc} example {index}: `{command}` printed\n{printed}"
