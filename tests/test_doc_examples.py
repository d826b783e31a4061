"""Every doc example marked ``<!-- doc-example -->`` is run, and its shown output checked.

A marked example is a fenced block of ``$`` commands, each followed by the output the
docs show (``...`` leaves lines out; ``>>>`` lines are Python shown beside it).
``precguard``, ``pytest`` and ``python`` run as this interpreter's; ``echo $?`` says the
exit code before it; anything else (``git``, ``find ... | xargs du -b``) runs in bash;
leading ``NAME=value`` words set the environment. Each command runs in a scratch
directory (``examples/`` reachable as in the repository) in an 80-column terminal;
each shown line must appear in what it printed, whitespace, panel borders and the
length of pytest's ``===`` rules aside; ``...`` inside a line elides part of it. So a
verdict, a count or a remedy's numbers that drift fail here; wall times (``0.26 s``,
``8.82s``) are masked on both sides, so they are never checked (issue 39).

``<!-- doc-example setup=NAME -->`` runs an example in a directory of its own after
``tests/doc_setups.py`` made what a ``$`` line cannot (a Python snippet's runs, a
two-rank torchrun on gloo, a lock held by another process); ``dir=NAME`` runs the
examples of one story in one directory, in order (guard.md's project, watch.md's run).

Run (30 examples): newcomer.md (3), generate.md (6), compare.md (5: the softmax-fp16
summary, replay, ``--replay``, ``--map``, the rope bug), bisect.md, impact.md's
``generate-diff --verify``, op-check.md's length note, recording.md's held lock,
guard.md's whole story (7: goldens written, their sizes, pass, emu:bf16 margins, the
planted gain failing, the refresh's ``git diff --stat``, the review in a ``git
worktree``), distributed.md's ``ranks`` (torchrun), watch.md (3: the training
script, ``watch-report``, ``bitwise``), plugins.md's hook trace.

A block that shows output but is not run says why in the doc, ``<!-- illustrative:
WHY -->``; the first test fails on any block that is neither. Illustrative today: the
three benchmark transcripts (compare.md's calibration corpus, 911 s; watch.md's
``watch_overhead.py`` twice): wall times of minutes of work on a loaded machine.
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
#: ``<!-- doc-example -->``, ``<!-- doc-example setup=NAME -->`` (run in a directory of its
#: own that ``doc_setups.SETUPS[NAME]`` prepared: runs a script or torchrun wrote) and
#: ``dir=NAME`` (the directory ``NAME``, shared by the examples of one story, in order)
MARK = re.compile(r"<!-- doc-example(?: dir=([\w-]+))?(?: setup=([\w-]+))? -->")
#: a shown example the docs say is not run, and why: ``<!-- illustrative: WHY -->``
ILLUSTRATIVE = re.compile(r"<!-- illustrative: [^>]+ -->")
FENCE = re.compile(r"```[^\n]*\n(.*?)```", re.S)


def examples() -> list[tuple[str, int, str, str | None, str | None]]:
    """(doc, index, block, dir, setup) of every marked example in docs/."""
    found = []
    for doc in sorted((ROOT / "docs").glob("*.md")):
        text = doc.read_text()
        for i, mark in enumerate(MARK.finditer(text)):
            block = re.match(r"\s*```[^\n]*\n(.*?)```", text[mark.end() :], re.S)
            assert block, f"{doc.name}: {mark.group(0)} must be followed by a fenced block"
            found.append((doc.name, i, block.group(1), mark.group(1), mark.group(2)))
    return found


def _shows_output(block: str) -> bool:
    """A block with a ``$`` command and at least one line it printed."""
    return any(shown for _, shown in _steps(block))


def test_every_shown_precguard_output_in_the_docs_is_run_or_says_why_not() -> None:
    """A block that shows what a ``$`` command printed is a doc example (checked here)
    or says in the doc why it is only illustrative."""
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
TIME = re.compile(r"\b\d+(?:\.\d+)?(?:e[-+]?\d+)? ?s\b")


#: pytest's rule of ``=`` around a summary: its length follows the time's width
RULE = re.compile(r"={3,}")


def _flat(text: str) -> str:
    text = RULE.sub("===", TIME.sub("<time> s", text.replace("│", " ").replace("┃", " ")))
    return " ".join(text.split())


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


#: a command's leading ``NAME=value`` words: its environment
ASSIGN = re.compile(r"^[A-Z_][A-Z0-9_]*=")
#: how each program of an example runs here: this Python, its precguard and pytest
PROGRAMS = {
    "precguard": [sys.executable, "-m", "precguard"],
    "pytest": [sys.executable, "-m", "pytest", "-p", "no:cacheprovider"],
    "python": [sys.executable],
}


def _run(command: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """One ``$`` line as a user types it: precguard, pytest and python as themselves, any
    other (``git``, ``find ... | xargs du -b``) through bash."""
    argv = shlex.split(command, comments=True)
    while argv and ASSIGN.match(argv[0]):
        name, _, value = argv.pop(0).partition("=")
        env = {**env, name: value}
    argv = [*PROGRAMS[argv[0]], *argv[1:]] if argv[0] in PROGRAMS else ["bash", "-c", command]
    return subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, check=False)


@pytest.mark.slow
@pytest.mark.parametrize(("doc", "index", "block", "story", "setup"), examples(),
                         ids=lambda v: str(v)[:20])  # fmt: skip
def test_the_doc_example_prints_what_it_shows(
    doc: str, index: int, block: str, story: str | None, setup: str | None, scratch: Path
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.pop("PRECGUARD_LOG_JSON", None)
    env.update(PYTHONPATH=f"{ROOT / 'src'}:{ROOT}", COLUMNS="80", NO_COLOR="1")
    here = scratch
    if story is not None:
        here = scratch / story
        if not here.exists():
            _directory(here)
    elif setup is not None:
        here = _directory(scratch / f"{doc}-{index}")
    prepare: Callable[[Path], contextlib.AbstractContextManager[object]] = (
        doc_setups.SETUPS[setup] if setup else lambda _: contextlib.nullcontext()
    )
    with prepare(here):
        last = 0
        for command, shown in _steps(block):
            if command == "echo $?":  # the exit code of the command before
                printed = str(last)
            else:
                out = _run(command, here, env)
                last, printed = out.returncode, out.stdout + out.stderr
            missing = [line for line in shown if not _appears(line, _flat(printed))]
            assert not missing, f"{doc} example {index}: `{command}` printed\n{printed}"
