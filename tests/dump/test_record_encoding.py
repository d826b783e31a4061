"""Records on disk: strict JSON, non-finite statistics as strings, floats read back exactly."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from pydantic_core import to_json
from torch import nn

import precguard
from precguard.capture.stats import StatsBuffer
from precguard.dump.writer import record_json


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


def _record(stats: dict | None, **fields: object) -> dict:
    return {
        "key": "m.0.forward.output.0",
        "module": "m",
        "module_type": "Linear",
        "call": 0,
        "phase": "forward",
        "role": "output",
        "index": 0,
        "name": "output",
        "step": 0,
        "rank": 0,
        "seq": 0,
        "dtype": "float32",
        "shape": [2, 3],
        "stats": stats,
        **fields,
    }


def _stats(**values: float) -> dict:
    row = {"min": -1.5, "max": 2.0, "mean": 1e-5, "std": 0.1, "absmax": 2.0, "l2": 3.25}
    return {**row, **values, "nan": 0, "inf": 0, "zeros": 1, "numel": 6}


@pytest.mark.parametrize(
    "rec",
    [
        _record(_stats()),
        _record(None),  # an integer tensor's record
        _record(_stats(min=-0.0, mean=5e-324, l2=1.7976931348623157e308, std=1e16)),
        _record(_stats(min=-math.inf, max=math.inf, mean=math.nan)),  # orjson: null
        _record(_stats(std=math.inf)),  # beyond float32's range
        _record(_stats(max=1e308, l2=1e308)),  # finite, but their sum overflows
        _record(_stats(mean=None)),  # not recorded (a converted dump)
        _record({**_stats(), "fp8": {"saturated": 0.0, "underflow": 0.5, "amax": 448.0}}),
        _record(_stats(), name='kwargs."quoted"\\\n\t\x00\x1f é中文🙂 \u2028</script>'),
        _record(_stats(), seq=2**63 - 1, call=2**64),  # beyond 64 bits: orjson refuses
        _record(_stats(), sample={"seed": 7, "dtype": "float32", "values": "AAAAPw=="}),
    ],
    ids=lambda rec: str(rec)[-60:],
)
def test_a_records_line_is_pydantic_cores_encoding(rec):
    # records.jsonl's lines come from orjson where it writes the same bytes, and from
    # pydantic-core (the model's own encoding) where it would not (a non-finite float)
    assert record_json(rec) == to_json(rec, inf_nan_mode="strings")


def test_finite_float_forms_are_pydantic_cores():
    rng = np.random.default_rng(0)
    values = rng.standard_normal(20_000) * 10.0 ** rng.integers(-300, 300, 20_000)
    tiny = np.float64(5e-324) * rng.integers(1, 2**20, 2_000)  # subnormals
    for v in [*values.tolist(), *tiny.tolist(), 0.1, 1e-7, 1e16, 1e21, 1e22, 123.0]:
        rec = _record(_stats(mean=v))
        assert record_json(rec) == to_json(rec, inf_nan_mode="strings"), v
