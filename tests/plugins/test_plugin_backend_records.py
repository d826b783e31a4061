"""A third-party chip, end to end: registered by a plugin, used by ``record``.

The chip runs on the host CPU (so it needs no hardware) and keeps a status
register per step, the way Ascend's saturation mode keeps its overflow flag.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from precguard import Backend, Run, hookimpl, plugins, record_target


class StatusChip(Backend):
    device_type = "statuschip"

    def torch_device(self) -> torch.device:
        return torch.device("cpu")  # the chip runs on the host: models and batches go there

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "statuschip.firmware": "1.2.3"}

    def vendor_state(self, step: int, out_dir: Path) -> dict[str, Any] | None:
        return {"overflow_flag": step == 1}


class StatusChipPlugin:
    @hookimpl
    def precguard_register_backends(self, register) -> None:
        register(StatusChip)


def test_record_keeps_the_chips_fingerprint_and_state_per_step(tmp_path: Path) -> None:
    pm = plugins.load_plugins()
    pm.register(StatusChipPlugin(), name="statuschip")
    try:
        out = record_target("tiny-llama", device="statuschip:0", out=tmp_path / "run", steps=2)
    finally:
        pm.unregister(name="statuschip")
    run = Run(out)
    assert run.manifest.fingerprint["statuschip.firmware"] == "1.2.3"
    assert run.manifest.fingerprint["torch.version"] == torch.__version__
    lines = (out / "rank0" / "vendor.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in lines] == [
        {"step": 0, "device": "statuschip:0", "state": {"overflow_flag": False}},
        {"step": 1, "device": "statuschip:0", "state": {"overflow_flag": True}},
    ]
