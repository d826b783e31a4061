"""The plugin manager: built-ins, entry points, the environment variables, broken plugins."""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from precguard import hookimpl, plugins
from precguard.backend import Backend


class ChipBackend(Backend):
    device_type = "chip"


class ChipPlugin:
    """A small class plugin, registered and unregistered by the tests (the llm way)."""

    @hookimpl
    def precguard_backend(self, device: str) -> Backend | None:
        return ChipBackend(device) if device == "chip" else None

    @hookimpl
    def precguard_device_types(self) -> list[str]:
        return ["chip"]

    @hookimpl
    def precguard_fingerprint(self, device: str) -> dict[str, Any] | None:
        if device != "chip":
            return None
        raise RuntimeError("chip driver crashed")


def _fake_distribution(root: Path, name: str, module_source: str) -> None:
    """Make ``root`` look like site-packages holding one plugin distribution."""
    module = f"{name}_plugin"
    (root / f"{module}.py").write_text(textwrap.dedent(module_source))
    info = root / f"{name}-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(f"[precguard]\n{name} = {module}\n")


def test_load_is_lazy_and_idempotent() -> None:
    probe = (
        "import sys, precguard\n"
        "from precguard import plugins\n"
        "loaded = [m for m in sys.modules if m.startswith(('precguard_', 'precguard.backends'))]\n"
        "assert not plugins._loaded and not loaded, loaded\n"
    )
    fresh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr  # importing precguard loads no plugin
    pm = plugins.load_plugins()
    assert plugins.load_plugins() is pm
    names = {name for name, _ in pm.list_name_plugin()}
    assert {"cpu", "emu", "cuda", "ascend", "cambricon"} <= names


def test_class_plugin_answers_and_a_raising_hook_is_isolated() -> None:
    plugin = ChipPlugin()
    plugins.load_plugins().register(plugin, name="chip")
    try:
        assert isinstance(plugins.get_backend("chip"), ChipBackend)
        assert "chip" in plugins.device_types()["chip"]
        facts = plugins.fingerprint("chip")  # chip's hook raises; the cpu plugin still answers
        assert "torch.version" in facts
        assert (
            "RuntimeError: chip driver crashed" in plugins.hook_errors["chip.precguard_fingerprint"]
        )
    finally:
        plugins.load_plugins().unregister(plugin, name="chip")
        plugins.hook_errors.clear()
    assert plugins.get_backend("chip") is None


def test_a_plugin_that_fails_to_import_is_reported_and_the_rest_work(
    fresh_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(
        tmp_path,
        "brokenchip",
        'raise ImportError("libbroken.so: cannot open shared object file")\n',
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    plugins.load_plugins()
    assert plugins.load_errors["brokenchip"] == (
        "ImportError: libbroken.so: cannot open shared object file"
    )
    assert plugins.get_backend("cpu") is not None
    assert plugins.get_backend("npu") is not None  # other entry points still loaded
    described = plugins.describe()
    assert {"name": "brokenchip", "cause": plugins.load_errors["brokenchip"]} in described[
        "load_errors"
    ]


def test_unknown_hook_names_are_flagged(
    fresh_plugins: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_distribution(
        tmp_path,
        "typochip",
        """
        from precguard import hookimpl

        @hookimpl
        def precguard_backnd(device):
            return None
        """,
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.invalidate_caches()
    entry = next(p for p in plugins.describe()["plugins"] if p["name"] == "typochip")
    assert entry["version"] == "0.3" and entry["distribution"] == "typochip"
    assert "unknown hook 'precguard_backnd'" in entry["warnings"][0]


def test_disable_autoload_keeps_only_builtins(
    fresh_plugins: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRECGUARD_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = {p["name"] for p in plugins.describe()["plugins"]}
    assert {"cpu", "emu"} <= names
    assert not names & {"cuda", "ascend", "cambricon"}
    assert plugins.get_backend("npu") is None


def test_precguard_plugins_limits_entry_points(
    fresh_plugins: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRECGUARD_PLUGINS", "ascend")
    names = {p["name"] for p in plugins.describe()["plugins"]}
    assert "ascend" in names and not names & {"cuda", "cambricon"}


def test_trace_hooks_names_the_answering_plugin(
    fresh_plugins: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRECGUARD_TRACE_HOOKS", "1")
    plugins.get_backend("emu:fp16")
    err = capsys.readouterr().err
    assert "precguard_backend(device='emu:fp16')" in err
    assert "emu -> EmuBackend('emu:fp16')" in err
    plugins.load_plugins().hook.precguard_device_types()  # direct pluggy calls are traced too
    err = capsys.readouterr().err
    assert "precguard_device_types() asks [" in err and "'npu'" in err


def test_a_later_plugin_overrides_a_check_id(caplog: pytest.LogCaptureFixture) -> None:
    """pluggy asks the last registered plugin first; its check wins and the loser is logged."""
    from precguard.checks.base import Check, Finding

    class DuplicatePlugin:
        @hookimpl
        def precguard_register_checks(self, register) -> None:
            register(
                Check(
                    "env.cuda_tf32",
                    "an impostor",
                    lambda ctx: Finding(id="env.cuda_tf32", status="pass", summary="x"),
                )
            )

    plugins.load_plugins().register(DuplicatePlugin(), name="duplicate")
    try:
        checks = plugins.collect_checks()
        assert checks["env.cuda_tf32"].description == "an impostor"
        assert "check_id_taken check='env.cuda_tf32' plugin='cuda' owner='duplicate'" in caplog.text
    finally:
        plugins.load_plugins().unregister(name="duplicate")


def test_vendor_dump_writes_one_line_per_plugin_and_step(tmp_path: Path) -> None:
    class StatePlugin:
        @hookimpl
        def precguard_vendor_dump(self, device: str, step: int, out_dir: Path):
            out_dir.mkdir(parents=True, exist_ok=True)
            (out_dir / f"step{step}.txt").write_text("registers")
            return {"temperature_c": 61}

    plugins.load_plugins().register(StatePlugin(), name="stateful")
    try:
        lines = plugins.vendor_dump("cpu", 2, tmp_path, rank=1)
    finally:
        plugins.load_plugins().unregister(name="stateful")
    assert lines == [{"step": 2, "plugin": "stateful", "state": {"temperature_c": 61}}]
    assert (tmp_path / "rank1" / "vendor" / "stateful" / "step2.txt").is_file()
    assert (tmp_path / "rank1" / "vendor.jsonl").is_file()


def test_a_register_checks_hook_that_raises_is_reported_and_the_others_register() -> None:
    class BrokenChecksPlugin:
        @hookimpl
        def precguard_register_checks(self, register) -> None:
            raise RuntimeError("checks module missing")

    plugins.load_plugins().register(BrokenChecksPlugin(), name="brokenchecks")
    try:
        checks = plugins.collect_checks()
        assert plugins.hook_errors["brokenchecks.precguard_register_checks"] == (
            "RuntimeError: checks module missing"
        )
        assert "env.cuda_tf32" in checks  # the other plugins' checks are still there
    finally:
        plugins.load_plugins().unregister(name="brokenchecks")
        plugins.hook_errors.clear()
