"""Profiles: the built-in set, user files, and one-line errors for bad ones."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from precguard import DeviceUnavailableError, load_run, plugins, record_target, resolve_backend
from precguard.backends.emu.profile import EmuProfileError, builtin_profiles, load_profile
from precguard.cli import main
from tests.emu.models import blowup_target

REQUIRED = {
    "fp16", "bf16", "fp16-saturate", "fp16-lowacc", "bf16-lowacc", "fp16-ftz",
    "fp32-shuffled", "fp32-rng", "softmax-fp16",
}  # fmt: skip


def test_builtin_profiles_load_and_describe_themselves() -> None:
    assert set(builtin_profiles()) >= REQUIRED
    for name in builtin_profiles():
        profile, source, digest = load_profile(name)
        assert profile.name == name and source == f"builtin:{name}" and len(digest) == 64
        assert profile.description


def test_a_user_profile_file_is_a_device(tmp_path: Path) -> None:
    path = tmp_path / "mychip.toml"
    path.write_text(
        'description = "my chip"\ncompute_dtype = "float16"\noverflow = "saturate"\n'
        '[op_dtypes]\nsoftmax = "float32"\n'
    )
    backend = resolve_backend(f"emu:{path}")
    facts = backend.fingerprint()
    assert facts["emu.profile"] == "mychip" and facts["emu.source"] == str(path.resolve())
    assert facts["emu.op_dtypes"] == {"softmax": "float32"}
    run = record_target(blowup_target(), device=f"emu:{path}", out=tmp_path / "run")
    stats = {r.key: r.stats for r in load_run(run).records()}
    assert stats["big.0.forward.output.0"].absmax == 65504.0


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('compute_dtype = "float8"', "field 'compute_dtype'"),
        ("overflw = 'inf'", "field 'overflw': Extra inputs are not permitted"),
        ('[op_dtypes]\nsofmax = "float16"', "unknown op 'sofmax'"),
        ("compute_dtype = ", "not valid TOML"),
        ("schema_version = 9", "newer than this precguard reads"),
    ],
)
def test_bad_profiles_fail_with_one_line(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(text + "\n")
    with pytest.raises(EmuProfileError, match="emu profile") as info:
        load_profile(str(path))
    assert message in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(DeviceUnavailableError, match=f"device 'emu:{path}' is unavailable"):
        resolve_backend(f"emu:{path}")


def test_unknown_and_missing_profiles() -> None:
    ok, reason = plugins.get_backend("emu:fp12").availability()
    assert not ok and "unknown emu profile 'fp12'" in reason and "fp16-saturate" in reason
    assert "emu needs a profile" in plugins.get_backend("emu").availability()[1]
    assert "no such file" in plugins.get_backend("emu:/nope/chip.toml").availability()[1]


def test_record_on_emu_through_the_cli(tmp_path: Path, capsys) -> None:
    target = Path(__file__).with_name("models.py")
    out = tmp_path / "run"
    main_args = ["record", "--target", f"{target}:blowup_target", "--device", "emu:fp16"]
    with pytest.raises(SystemExit) as info:
        main([*main_args, "--out", str(out)])
    assert info.value.code in (0, None)
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["device"] == "emu:fp16"
    assert manifest["fingerprint"]["emu.compute_dtype"] == "float16"
    capsys.readouterr()


def test_every_profile_field_is_documented() -> None:
    from precguard.backends.emu.profile import EmuProfile

    guide = (Path(__file__).resolve().parents[2] / "docs" / "emu.md").read_text()
    missing = [f for f in EmuProfile.model_fields if f"| `{f}` |" not in guide]
    assert not missing, f"docs/emu.md's profile table lacks {missing}"
