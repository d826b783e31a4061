"""Every ``precguard ...`` command line the README shows parses as the CLI would parse it."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from precguard.cli import app

README = Path(__file__).resolve().parent.parent / "README.md"

#: options a command refuses to run without although the parser takes it as optional
#: (replay: the recording never chooses the code that runs, see docs/compare.md)
NEEDED_AT_RUN: dict[str, tuple[str, ...]] = {"replay": ("target",)}


def _readme_commands(text: str) -> list[str]:
    """The ``precguard ...`` lines of the README's code blocks (inline mentions such as
    `precguard ranks` name a command; the blocks are what a reader copies)."""
    blocks = re.findall(r"```[a-z]*\n(.*?)```", text, flags=re.S)
    lines = [line.strip() for block in blocks for line in block.splitlines()]
    found = [line for line in lines if line.startswith("precguard ")]
    return [line.split("#", 1)[0].strip() for line in found]


def parse(line: str) -> tuple[str, dict]:
    """The subcommand and its parameters, as click parses ``line`` (nothing is run)."""
    group = typer.main.get_command(app)  # a click group (typer's own copy of click)
    name, *rest = shlex.split(line)[1:]  # the README puts no group option before a command
    with group.context_class(group, info_name="precguard") as ctx:
        command = group.get_command(ctx, name)
        assert command is not None, f"{line!r}: no command {name!r}"
        with command.make_context(name, rest, parent=ctx) as sub:
            return name, dict(sub.params)


COMMANDS = _readme_commands(README.read_text(encoding="utf-8"))


def test_the_readme_shows_commands() -> None:
    assert len(COMMANDS) >= 7, COMMANDS


@pytest.mark.parametrize("line", [c for c in COMMANDS if c != "precguard --version"])
def test_a_readme_command_line_parses(line: str) -> None:
    name, params = parse(line)
    missing = [p for p in NEEDED_AT_RUN.get(name, ()) if params.get(p) is None]
    assert not missing, f"{line!r}: {name} refuses to run without --{', --'.join(missing)}"


def test_a_replay_without_a_target_is_caught() -> None:
    name, params = parse("precguard replay runs/golden --module model.layers.3.mlp")
    assert name == "replay" and params["target"] is None


def test_a_misspelt_option_fails_to_parse() -> None:
    with pytest.raises(Exception, match="No such option: --jsn"):
        parse("precguard compare runs/golden runs/actual --jsn diff.json")
