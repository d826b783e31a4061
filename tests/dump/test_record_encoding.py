"""Records on disk: strict JSON, non-finite statistics as strings, floats read back exactly."""

from __future__ import annotations

import json
import math

import torch
from torch import nn

import precguard
from precguard.capture.stats import StatsBuffer


class Odd(nn.Module):
    """Outputs that stress the encoding: NaN, both infinities, tiny and huge values."""

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        nan = torch.tensor([1.0, float("nan"), 2.0])
        infs = torch.tensor([float("inf"), -float("inf"), 0.0])
        extreme = torch.tensor([5e-324, 1.7976931348623157e308, -1 / 3], dtype=torch.float64)
        return x / 3, nan, infs, extreme


def strict_json(line: str) -> dict:
    def refuse(token: str) -> None:
        raise AssertionError(f"bare {token} in a record: not JSON")

    return json.loads(line, parse_constant=refuse)


def test_nonfinite_and_extreme_statistics_round_trip(tmp_path):
    model = Odd()
    x = torch.randn(4, 5, dtype=torch.float64)
    with precguard.monitor(model, out=tmp_path / "run"):
        outputs = model(x)

    lines = (tmp_path / "run" / "rank0" / "records.jsonl").read_text("utf-8").splitlines()
    raw = {rec["key"]: rec for rec in map(strict_json, lines)}
    nan_stats = raw["root.0.forward.output.1"]["stats"]
    assert nan_stats["mean"] == "NaN" and nan_stats["nan"] == 1
    inf_stats = raw["root.0.forward.output.2"]["stats"]
    assert (inf_stats["min"], inf_stats["max"]) == ("-Infinity", "Infinity")

    # what the reader gives back is exactly what was computed, bit for bit
    buf = StatsBuffer()
    slots = [buf.add(t)[0] for t in outputs]
    want = buf.materialize()
    got = {rec.key: rec.stats for rec in precguard.load_run(tmp_path / "run").records()}
    for index, slot in enumerate(slots):
        stats = got[f"root.0.forward.output.{index}"]
        assert stats is not None
        for field, value in want[slot].items():
            loaded = getattr(stats, field)
            assert loaded == value or (math.isnan(loaded) and math.isnan(value)), (index, field)
