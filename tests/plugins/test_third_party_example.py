"""examples/third_party_plugin: installed by pip (offline, into a scratch folder) and listed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "third_party_plugin"
CLI = "import sys; from precguard.cli import main; main(sys.argv[1:])"


@pytest.mark.slow
def test_the_example_plugin_installs_and_is_listed(tmp_path: Path) -> None:
    source = tmp_path / "src"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    target = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(target), str(source)],
        check=True,
        capture_output=True,
    )  # fmt: skip
    assert (target / "precguard_lumen-0.1.0.dist-info" / "entry_points.txt").is_file()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), *sys.path])}
    env.pop("PRECGUARD_DISABLE_PLUGIN_AUTOLOAD", None)
    env.pop("PRECGUARD_PLUGINS", None)
    env.pop("LUMEN_FAST_MATH", None)

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", CLI, *args], env=env, capture_output=True, text=True
        )

    listing = cli("plugins", "--json")
    assert listing.returncode == 0, listing.stderr
    lumen = next(p for p in json.loads(listing.stdout)["plugins"] if p["name"] == "lumen")
    assert lumen["device_types"] == ["lum"]
    assert lumen["distribution"] == "precguard-lumen" and lumen["version"] == "0.1.0"
    assert lumen["hooks"] == ["precguard_register_backends", "precguard_register_checks"]
    assert lumen["checks"] == ["env.lumen_fast_math"]
    env_json = cli("env", "--device", "lum", "--json")
    assert env_json.returncode == 0, env_json.stderr
    doc = json.loads(env_json.stdout)
    assert doc["available"] is False and doc["reason"] == "lumen_sdk is not installed"
    assert doc["fingerprint"]["lumen.sdk_version"] is None
    assert doc["fingerprint"]["env.LUMEN_FAST_MATH"] is None  # unset, and listed as such
    record = cli("record", "-t", "tiny-llama", "--device", "lum", "--out", str(tmp_path / "run"))
    assert record.returncode == 2
    assert "device 'lum' is unavailable: lumen_sdk is not installed" in record.stderr
