"""``dump/`` owns the on-disk format: rank paths, validated records, one tensor store."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic_core import to_json

import precguard
from precguard.dump.paths import rank_dir, rank_dir_name, rank_of
from precguard.dump.tensors import TensorStore
from precguard.dump.writer import RunWriter, record_json

SRC = Path(precguard.__file__).resolve().parent


def _record(seq: int, **stats: float) -> dict:
    values = dict.fromkeys(("min", "max", "mean", "std", "absmax", "l2"), 1.0) | stats
    return {
        "key": f"layer.0.forward.output.{seq}",
        "module": "layer",
        "module_type": "Linear",
        "call": 0,
        "phase": "forward",
        "role": "output",
        "index": seq,
        "step": 0,
        "rank": 0,
        "seq": seq,
        "dtype": "float32",
        "shape": [4],
        "stats": values | {"nan": 0, "inf": 0, "zeros": 0, "numel": 4},
    }


def test_rank_folders_are_named_in_one_place():
    """Only dump/paths.py spells ``rank{R}``; everything else asks it."""
    spelled = re.compile(r"""f["']rank\{""")
    offenders = [
        str(path.relative_to(SRC))
        for path in SRC.rglob("*.py")
        if spelled.search(path.read_text(encoding="utf-8")) and path.name != "paths.py"
    ]
    assert offenders == []
    assert rank_of(rank_dir_name(12)) == 12
    assert rank_dir("runs/x", 3) == Path("runs/x/rank3")


def test_an_invalid_record_is_refused_before_anything_is_written(tmp_path):
    writer = RunWriter(tmp_path / "run")
    good, bad = _record(0), _record(1)
    bad["phase"] = "sideways"

    with pytest.raises(ValueError, match=r"record 'layer.0.forward.output.1'.*phase"):
        writer.write_records([good, bad])
    writer.close()

    assert (tmp_path / "run" / "rank0" / "records.jsonl").read_bytes() == b""


def test_capture_batches_validate_each_new_layout_and_write_the_same_lines(tmp_path):
    """``trusted`` (capture's own records) checks a layout once; a refused one stays refused."""
    plain, trusted = RunWriter(tmp_path / "plain"), RunWriter(tmp_path / "trusted")
    batches = [[_record(0), _record(1)], [_record(2, min=-math.inf)], [_record(3) | {"call": 1}]]
    for batch in batches:
        plain.write_records(batch)
        trusted.write_records(batch, trusted=True)
    missing = _record(5)
    del missing["dtype"]  # a field set not seen before: validated, and refused
    for _ in range(2):  # refused again: a layout is remembered only once it passed
        with pytest.raises(ValueError, match=r"record 'layer.0.forward.output.5'.*dtype"):
            trusted.write_records([missing], trusted=True)
    plain.close()
    trusted.close()

    assert (tmp_path / "trusted" / "rank0" / "records.jsonl").read_bytes() == (
        tmp_path / "plain" / "rank0" / "records.jsonl"
    ).read_bytes()


def test_non_finite_statistics_are_strict_json_and_read_back(tmp_path):
    writer = RunWriter(tmp_path / "run")
    writer.write_records(
        [_record(0, min=-math.inf, max=math.inf, mean=math.nan), _record(1, l2=2.5e-300)]
    )
    writer.close()

    lines = (tmp_path / "run" / "rank0" / "records.jsonl").read_text().splitlines()
    first = json.loads(lines[0], parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
    assert first["stats"]["min"] == "-Infinity"
    assert first["stats"]["max"] == "Infinity"
    assert first["stats"]["mean"] == "NaN"
    assert "tensor" not in first and "compute_dtype" not in first  # unset: left out
    stats = [r.stats for r in precguard.load_run(tmp_path / "run").records()]
    assert stats[0].min == -math.inf and stats[0].max == math.inf and math.isnan(stats[0].mean)
    assert stats[1].l2 == 2.5e-300


def test_records_written_by_earlier_versions_still_read(tmp_path):
    """The hand-written encoder of earlier versions: json.dumps, non-finite as strings."""
    writer = RunWriter(tmp_path / "run")
    writer.close()
    old = _record(0)
    old["stats"] |= {"min": "-Infinity", "max": "Infinity", "mean": "NaN"}
    old["nonfinite_origin"] = True
    line = json.dumps(old, separators=(",", ":"))
    (tmp_path / "run" / "rank0" / "records.jsonl").write_text(line + "\n")

    (rec,) = precguard.load_run(tmp_path / "run").records()

    assert rec.stats.min == -math.inf and math.isnan(rec.stats.mean)
    assert rec.nonfinite_origin is True


def test_run_tensor_reads_through_the_store_compare_and_replay_use(tmp_path):
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU())
    with torch.no_grad(), precguard.monitor(model, tmp_path / "run", tensors=True):
        model(torch.ones(2, 4))
    run = precguard.load_run(tmp_path / "run")
    rec = next(r for r in run.records() if r.key == "0.0.forward.output.0")

    assert isinstance(run.tensors, TensorStore)
    loaded = run.tensor(rec)
    assert torch.equal(loaded, model[0](torch.ones(2, 4)).detach())
    loaded += 1  # a copy of its own: the mapped file is never written
    assert not torch.equal(run.tensor(rec), loaded)


class _MakesNaN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(4, 4)
        self.log = _Log()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log(self.proj(x))


class _Log(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x - 10.0)  # NaN from finite inputs


def test_a_session_writes_nothing_outside_its_recordings(tmp_path, monkeypatch):
    """Record (saving a NaN origin's inputs), compare: the working directory stays empty."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    torch.manual_seed(0)
    model = _MakesNaN()
    runs = []
    for name in ("golden", "actual"):
        with (
            torch.no_grad(),
            precguard.monitor(model, tmp_path / name, tensors=True, on_nonfinite="save"),
        ):
            model(torch.ones(2, 4))
        runs.append(tmp_path / name)

    precguard.compare_runs(*runs)

    assert list(cwd.iterdir()) == []
    (origin,) = (tmp_path / "golden" / "rank0").glob("nonfinite-*")
    assert (origin / "inputs.safetensors").is_file()


# -- the line encoding: orjson where it writes pydantic-core's bytes (record_json) --


@pytest.mark.parametrize(
    "rec",
    [
        _record(0, mean=1e-5, std=0.1),
        _record(0) | {"stats": None},  # an integer tensor's record
        _record(0, min=-0.0, mean=5e-324, l2=1.7976931348623157e308, std=1e16),
        _record(0, min=-math.inf, max=math.inf, mean=math.nan),  # orjson: null
        _record(0, std=math.inf),  # beyond float32's range
        _record(0, max=1e308, l2=1e308),  # finite, but their sum overflows
        _record(0, mean=None),  # type: ignore[arg-type]  # not recorded (a converted dump)
        _record(0, fp8={"saturated": 0.0, "underflow": 0.5, "amax": 448.0}),  # type: ignore[arg-type]
        _record(0) | {"name": 'kwargs."quoted"\\\n\t\x00\x1f é中文🙂 \u2028</script>'},
        _record(0) | {"seq": 2**63 - 1, "call": 2**64},  # beyond 64 bits: orjson refuses
        _record(0) | {"sample": {"seed": 7, "dtype": "float32", "values": "AAAAPw=="}},
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
        rec = _record(0, mean=v)
        assert record_json(rec) == to_json(rec, inf_nan_mode="strings"), v
