"""The commands in CI: plain text when not on a terminal or with NO_COLOR, stable exit codes.

Run as CI runs them: a subprocess whose output is a pipe (a CI log), and one on
a pseudo-terminal (a developer's shell) with and without ``NO_COLOR``.
"""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
from pathlib import Path

import pytest

from precguard.testing import record_model
from tests.guard.models import batch, build

#: an SGR sequence setting a colour (foreground/background, 8, 16, 256 or true colours)
_COLOUR = re.compile(r"\x1b\[(?:[0-9;]*;)?(?:3[0-9]|4[0-9]|9[0-7]|10[0-7])(?:;[0-9;]*)?m")
#: what a progress bar (rich's live display) writes first: hide the cursor
_BAR = "\x1b[?25l"


@pytest.fixture(scope="module")
def diverged(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``compare`` arguments for a golden and a run whose layer 1 is off by 1 %."""
    base = tmp_path_factory.mktemp("ci")
    faulty = build()
    faulty.layers[1].gain = 1.01
    golden = record_model(build(), batch(), base / "golden")
    actual = record_model(faulty, batch(), base / "actual")
    return ["compare", str(golden), str(actual)]


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "FORCE_COLOR")}
    env.update(TERM="xterm-256color", COLUMNS="100", **extra)
    return env


def _on_a_terminal(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``precguard ARGS`` with stdout and stderr on a pseudo-terminal: exit code, output."""
    main, child = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "precguard", *args],
        stdin=subprocess.DEVNULL,
        stdout=child,
        stderr=child,
        env=env,
    )
    os.close(child)
    chunks = []
    while True:
        try:
            data = os.read(main, 65536)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(main)
    return proc.wait(timeout=120), b"".join(chunks).decode("utf-8", "replace")


@pytest.mark.slow
def test_in_a_ci_log_the_output_is_plain_text(diverged: list[str], tmp_path: Path) -> None:
    junit = tmp_path / "compare.xml"
    proc = subprocess.run(
        [sys.executable, "-m", "precguard", *diverged, "--junit-xml", str(junit)],
        capture_output=True,
        text=True,
        env=_env(),
        timeout=120,
    )
    assert proc.returncode == 1
    assert "DIVERGED" in proc.stdout and "layers.1" in proc.stdout
    assert "\x1b" not in proc.stdout and "\x1b" not in proc.stderr
    assert junit.is_file()


@pytest.mark.slow
def test_on_a_terminal_no_color_turns_colour_and_progress_bars_off(diverged: list[str]) -> None:
    code, coloured = _on_a_terminal(diverged, _env())
    assert code == 1
    assert _COLOUR.search(coloured), "on a terminal the verdict is coloured"
    assert _BAR in coloured, "on a terminal compare shows its progress"
    code, plain = _on_a_terminal(diverged, _env(NO_COLOR="1"))
    assert code == 1
    assert "DIVERGED" in plain and "layers.1" in plain
    assert not _COLOUR.search(plain)
    assert _BAR not in plain
