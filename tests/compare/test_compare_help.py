"""``compare --help`` describes the profiles as the judge applies them."""

from __future__ import annotations

import re

import pytest

from precguard.cli import main
from precguard.compare import PROFILES


def test_the_help_names_every_profile_and_gives_the_default_its_rule(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("COLUMNS", "200")
    with pytest.raises(SystemExit) as exit_:
        main(["compare", "--help"])
    assert exit_.value.code == 0
    text = " ".join(re.sub(r"[│╭╮╰╯─]", " ", capsys.readouterr().out).split())
    profiles = text[text.index("Profiles (--profile):") :]
    for name in PROFILES:
        assert f"{name} " in profiles, name
    # the rel-L2 gate is the fixed profile's; the default judges by the expected error
    assert PROFILES["default"].rule == "expected" and PROFILES["fixed"].rule == "rel_l2"
    assert "default judges each record by the error its precision explains" in profiles
    assert profiles.index("fixed: rel-L2 <= k") < profiles.index("strict:")
    assert "precguard bitwise GOLDEN ACTUAL" in text
