"""The plugin manager: built-ins, entry points, the environment variables, broken plugins."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from precguard import Backend, hookimpl, plugins
from precguard.checks import Check, Finding


class ChipBackend(Backend):
    device_type = "chip"

    def fingerprint(self) -> dict:
        raise RuntimeError("chip driver crashed")


class ChipPlugin:
    """A small class plugin, registered and unregistered by the tests (the llm way)."""

    @hookimpl
    def precguard_register_backends(self, register) -> None:
        register(ChipBackend)


def describe() -> dict:
    """What ``precguard plugins --json`` prints, read back as a script reads it."""
    from precguard.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main(["plugins", "--json"])
    assert exited.value.code in (0, None), out.getvalue()
    return json.loads(out.getvalue())


def _check(check_id: str, description: str) -> Check:
    return Check(check_id, description, lambda ctx: Finding(id=check_id, status="pass", summary=""))


def _fake_distribution(root: Path, name: str, module_source: str) -> None:
    """Make ``root`` look like site-packages holding one plugin distribution."""
    module = f"{name}_plugin"
    (root / f"{module}.py").write_text(textwrap.dedent(module_source))
    info = root / f"{name}-0.3.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.3\n")
    (info / "entry_points.txt").write_text(f"[precguard]\n{name} = {module}\n")


@pytest.mark.slow
def test_importing_precguard_loads_no_plugin() -> None:
    probe = (
        "import sys, precguard\n"
        "from precguard import plugins\n"
        "loaded = [m for m in sys.modules if m.startswith(('precguard_', 'precguard.backends'))]\n"
        "assert not plugins._loaded and not loaded, loaded\n"
    )
    fresh = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert fresh.returncode == 0, fresh.stderr


def test_load_is_idempotent() -> None:
    pm = plugins.load_plugins()
    assert plugins.load_plugins() is pm
    names = {name for name, _ in pm.list_name_plugin()}
    assert {"cpu", "emu", "cuda", "ascend", "cambricon"} <= names


def test_a_class_plugin_registers_a_backend_and_its_failing_fingerprint_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    plugin = ChipPlugin()
    plugins.load_plugins().register(plugin, name="chip")
    try:
        assert isinstance(plugins.get_backend("chip:1"), ChipBackend)
        assert plugins.get_backend("chip:1").device == "chip:1"
        assert plugins.registered("backends")["chip"].plugin == "chip"
        facts = plugins.fingerprint("chip")  # the backend raises; precguard's facts remain
        assert "torch.version" in facts
        assert facts["fingerprint.error"] == (
            "ChipBackend.fingerprint raised RuntimeError: chip driver crashed"
        )
        assert "fingerprint_failed" in caplog.text
    finally:
        plugins.load_plugins().unregister(plugin, name="chip")
    assert plugins.get_backend("chip") is None


def test_a_later_plugin_takes_over_a_device_type(caplog: pytest.LogCaptureFixture) -> None:
    builtin = type(plugins.get_backend("cpu"))

    class FastCpu(Backend):
        device_type = "cpu"

        def torch_device(self) -> torch.device:
            return torch.device("cpu")

    class FastCpuPlugin:
        @hookimpl
        def precguard_register_backends(self, register) -> None:
            register(FastCpu)

    plugins.load_plugins().register(FastCpuPlugin(), name="fastcpu")
    try:
        assert type(plugins.get_backend("cpu")) is FastCpu
        assert "device_type_taken device_type='cpu' plugin='cpu' owner='fastcpu'" in caplog.text
    finally:
        plugins.load_plugins().unregister(name="fastcpu")
    assert type(plugins.get_backend("cpu")) is builtin is not FastCpu  # the built-in again


def test_hook_wrappers_run_around_the_registration(fresh_plugins: None) -> None:
    """old- and new-style wrappers run around their own plugin's registration."""
    seen: list[str] = []

    class WrapperPlugin:
        @hookimpl(wrapper=True)
        def precguard_register_backends(self, register):
            seen.append("wrapper before")
            result = yield
            seen.append("wrapper after")
            return result

        @hookimpl(hookwrapper=True)
        def precguard_register_checks(self, register):
            seen.append("hookwrapper before")
            outcome = yield
            assert outcome.exception is None
            register(_check("env.wrapped", "registered by a wrapper after the others"))
            seen.append("hookwrapper after")

    plugins.load_plugins().register(WrapperPlugin(), name="wrapper")
    assert isinstance(plugins.get_backend("emu:fp16"), Backend)
    assert seen == ["wrapper before", "wrapper after"]
    checks = plugins.collect_checks()
    assert seen[2:] == ["hookwrapper before", "hookwrapper after"]
    assert "env.wrapped" in checks and "rng.same_seed" in checks


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
    described = describe()
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
    entry = next(p for p in describe()["plugins"] if p["name"] == "typochip")
    assert entry["version"] == "0.3" and entry["distribution"] == "typochip"
    assert "unknown hook 'precguard_backnd'" in entry["warnings"][0]


def test_disable_autoload_keeps_only_builtins(
    fresh_plugins: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRECGUARD_DISABLE_PLUGIN_AUTOLOAD", "1")
    names = {p["name"] for p in describe()["plugins"]}
    assert {"cpu", "emu"} <= names
    assert not names & {"cuda", "ascend", "cambricon"}
    assert plugins.get_backend("npu") is None


def test_precguard_plugins_limits_entry_points(
    fresh_plugins: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRECGUARD_PLUGINS", "ascend")
    names = {p["name"] for p in describe()["plugins"]}
    assert "ascend" in names and not names & {"cuda", "cambricon"}
    assert plugins.pm.is_blocked("cuda")  # pluggy's own blocking, undone by reset()
    plugins.reset()
    assert not plugins.pm.is_blocked("cuda")


def test_trace_hooks_names_the_registering_plugin(
    fresh_plugins: None, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("PRECGUARD_TRACE_HOOKS", "1")
    plugins.get_backend("emu:fp16")
    err = capsys.readouterr().err  # pluggy's hook tracing, and what each plugin registered
    assert "precguard_register_backends [hook]\n      register: <function register_for_emu" in err
    assert "backend for 'emu:fp16': EmuBackend (emu) [registry]" in err
    assert (
        "emu registers device_type 'emu': <class 'precguard.backends.emu.backend.EmuBackend'>"
        in err
    )
    plugins.collect_checks()
    err = capsys.readouterr().err
    assert "precguard_register_checks [hook]" in err
    assert "ascend registers check 'env.ascend_precision_mode'" in err


def test_a_later_plugin_overrides_a_check_id(caplog: pytest.LogCaptureFixture) -> None:
    """pluggy asks the last registered plugin first; its check wins and the loser is logged."""

    class DuplicatePlugin:
        @hookimpl
        def precguard_register_checks(self, register) -> None:
            register(_check("env.cuda_tf32", "an impostor"))

    plugins.load_plugins().register(DuplicatePlugin(), name="duplicate")
    try:
        checks = plugins.collect_checks()
        assert checks["env.cuda_tf32"].description == "an impostor"
        assert "check_taken check='env.cuda_tf32' plugin='cuda' owner='duplicate'" in caplog.text
    finally:
        plugins.load_plugins().unregister(name="duplicate")


def _helper_that_raises() -> None:
    raise RuntimeError("checks module missing")


def test_a_plugin_whose_registration_raises_is_reported_by_name_and_left_out(
    fresh_plugins: None, caplog: pytest.LogCaptureFixture
) -> None:
    class BrokenChecksPlugin:
        @hookimpl
        def precguard_register_checks(self, register) -> None:
            register(_check("env.broken_first", "registered before the failure"))
            _helper_that_raises()  # the culprit is found below the hook, too

    plugins.load_plugins().register(BrokenChecksPlugin(), name="brokenchecks")
    checks = plugins.collect_checks()
    assert plugins.load_errors["brokenchecks"] == (
        "precguard_register_checks raised RuntimeError: checks module missing"
    )
    assert "plugin_registration_failed" in caplog.text
    assert plugins.load_plugins().get_plugin("brokenchecks") is None
    assert "env.broken_first" not in checks  # nothing of a broken plugin is half-registered
    assert "env.cuda_tf32" in checks and "rng.same_seed" in checks  # the others still register


def test_registering_something_that_is_not_a_backend_is_the_plugins_fault(
    fresh_plugins: None,
) -> None:
    class ConfusedPlugin:
        @hookimpl
        def precguard_register_backends(self, register) -> None:
            register(ChipBackend("chip"))  # an instance, not the class

    plugins.load_plugins().register(ConfusedPlugin(), name="confused")
    assert plugins.get_backend("cpu") is not None
    assert plugins.load_errors["confused"].startswith(
        "precguard_register_backends raised TypeError: register() expects a Backend subclass"
    )
    described = describe()
    assert {"name": "confused", "cause": plugins.load_errors["confused"]} in described[
        "load_errors"
    ]


def test_register_kept_for_later_is_refused() -> None:
    kept: list = []

    class LatePlugin:
        @hookimpl
        def precguard_register_backends(self, register) -> None:
            kept.append(register)

    plugins.load_plugins().register(LatePlugin(), name="late")
    try:
        plugins.get_backend("cpu")
    finally:
        plugins.load_plugins().unregister(name="late")
    with pytest.raises(RuntimeError, match="after precguard_register_backends returned"):
        kept[0](ChipBackend)


def test_registries_are_kept_until_the_set_of_plugins_changes() -> None:
    pm = plugins.load_plugins()
    calls: list[str] = []
    undo = pm.add_hookcall_monitoring(
        lambda name, impls, kwargs: calls.append(name), lambda *a: None
    )
    try:
        plugins.get_backend("cpu")
        plugins.get_backend("emu:fp16")
        plugins.fingerprint("cpu")
        implementers = len(pm.hook.precguard_register_backends.get_hookimpls())
        # at most one build, which asks each plugin once
        assert calls.count("precguard_register_backends") in (0, implementers)
        calls.clear()
        pm.register(ChipPlugin(), name="chip")
        try:
            assert isinstance(plugins.get_backend("chip"), ChipBackend)
            assert calls == ["precguard_register_backends"] * (implementers + 1)
        finally:
            pm.unregister(name="chip")
        assert plugins.get_backend("chip") is None
    finally:
        undo()


class VendorPlugin:
    """One plugin class a vendor installs twice, once per chip generation it ships."""

    def __init__(self, device_type: str, broken: bool = False) -> None:
        self.backend = type(
            f"{device_type.title()}Backend", (Backend,), {"device_type": device_type}
        )
        self.broken = broken

    @hookimpl
    def precguard_register_backends(self, register) -> None:
        register(self.backend)
        if self.broken:
            raise RuntimeError("vendor-a's driver probe failed")


def test_two_instances_of_one_plugin_class_are_told_apart(fresh_plugins: None) -> None:
    pm = plugins.load_plugins()
    pm.register(VendorPlugin("aa"), name="vendor-a")
    pm.register(VendorPlugin("bb"), name="vendor-b")
    claimed = plugins.registered("backends")
    assert claimed["aa"].plugin == "vendor-a" and claimed["bb"].plugin == "vendor-b"


def test_one_of_two_instances_raising_leaves_the_other_registered(fresh_plugins: None) -> None:
    pm = plugins.load_plugins()
    pm.register(VendorPlugin("aa", broken=True), name="vendor-a")
    pm.register(VendorPlugin("bb"), name="vendor-b")
    assert plugins.get_backend("aa") is None  # nothing of the broken plugin is kept
    assert plugins.get_backend("bb").device_type == "bb"
    assert plugins.load_errors["vendor-a"] == (
        "precguard_register_backends raised RuntimeError: vendor-a's driver probe failed"
    )
    assert "vendor-b" not in plugins.load_errors
    assert pm.get_plugin("vendor-a") is None and pm.get_plugin("vendor-b") is not None
