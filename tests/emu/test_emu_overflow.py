"""fp16 overflow on a model whose activations exceed 65504 in one layer: inf vs saturation."""

from __future__ import annotations

from pathlib import Path

from precguard import load_run, record_target
from tests.emu.models import blowup_target

BIG = "big.0.forward.output.0"
INP = "inp.0.forward.output.0"


def _stats(run: Path) -> dict:
    return {r.key: r.stats for r in load_run(run).records()}


def test_fp16_records_inf_and_saturation_records_65504(tmp_path: Path) -> None:
    runs = {}
    for device in ("cpu", "emu:fp16", "emu:fp16-saturate"):
        out = tmp_path / device.replace(":", "_")
        record_target(blowup_target(), device=device, out=out)
        runs[device] = _stats(out)

    cpu, fp16, sat = runs["cpu"][BIG], runs["emu:fp16"][BIG], runs["emu:fp16-saturate"][BIG]
    assert cpu.absmax > 65504 and cpu.inf == 0  # the reference really exceeds fp16's range
    assert fp16.inf > 0
    assert sat.inf == 0 and sat.nan == 0
    assert sat.absmax == 65504.0
    # the layer before stays finite everywhere: the overflow is introduced in `big`
    for device in runs:
        assert runs[device][INP].inf == 0
    # the manifest says which numerics were emulated
    manifest = load_run(tmp_path / "emu_fp16-saturate").manifest
    assert manifest.fingerprint["emu.overflow"] == "saturate"
