"""A usage error returns before torch is imported (issue 41, item 4).

Importing torch takes seconds on an idle machine; a typo in a flag should not
wait for it. Every command module keeps torch, transformers and NumPy out of its
top-level imports, so the arguments are parsed, and a bad one refused (exit 2),
with none of them loaded. Fixed work, no clock: the tests look at what was
imported, not at how long it took (benchmarks/checklist_speed.py and the docs
give the time).
"""

from __future__ import annotations

import json
import subprocess
import sys

#: what a usage error must not have imported
HEAVY = ("torch", "transformers", "numpy")


def test_a_bad_option_is_refused_before_torch_is_imported() -> None:
    # the test, as the user would run it
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "precguard", "compare", "--bogus"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "No such option: --bogus" in proc.stderr
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "precguard.cli" in imported  # the probe sees the CLI's own imports
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


#: run in a fresh interpreter: every command with an option it does not know, then what
#: those runs imported
_EVERY_COMMAND = """
import json, sys
from precguard.cli import app, main

names = sorted(
    c.name or c.callback.__name__.replace("_", "-") for c in app.registered_commands
)
codes = {}
for name in names:
    try:
        main([name, "--no-such-option"])
    except SystemExit as exc:
        codes[name] = exc.code
heavy = sorted(m for m in sys.modules if m.split(".")[0] in %r)
print(json.dumps({"codes": codes, "heavy": heavy}))
"""


def test_every_command_refuses_a_bad_option_without_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _EVERY_COMMAND % (HEAVY,)], capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert {"record", "compare", "check", "op-check", "bisect"} <= set(seen["codes"])
    assert set(seen["codes"].values()) == {2}, seen["codes"]
    assert seen["heavy"] == []
