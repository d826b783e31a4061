"""A big step is compared as it streams: its records stay in their files, not in memory.

The user's story: a run records thousands of records in one step (a long
sequence, many micro-batches, many experts), and compare must not need memory
for every parsed record of both sides at once (docs/compare.md, "Memory"). The
bounds here are measured in the same process (what a parsed record costs), not
timed, so they hold on any machine.
"""

from __future__ import annotations

import gc
import json
import tracemalloc
from pathlib import Path

import pytest
import torch

import precguard
from precguard import CompareOptions, Manifest, Record

#: module calls in the one step: each records its input and its output
CALLS = 1000
#: the call whose output the actual run gets wrong (a 1 % scale error)
FAULTY = 617


def _record_step(path: Path, *, fault: bool, calls: int = CALLS) -> Path:
    """A one-rank, one-step recording of statistics records: ``calls`` Linear calls, each
    recording its input and output, the actual's output of call FAULTY 1 % too large."""
    (path / "rank0").mkdir(parents=True)
    manifest = Manifest(
        precguard_version=precguard.__version__,
        torch_version=torch.__version__,
        device="cpu",
        model="Synthetic",
        world_size=1,
        created="2026-12-04T00:00:00Z",
        run_id=path.name,  # each side its own run: compare refuses one run with itself
    )
    (path / "manifest.json").write_text(manifest.model_dump_json(), encoding="utf-8")
    lines = []
    for seq in range(2 * calls):
        call, out = divmod(seq, 2)
        module = f"model.layers.{call // 4}.mlp.fc{call % 4}"
        role = "output" if out else "input"
        mean, std = 0.01 * (call % 7), 1.0 + 0.01 * (call % 5)
        if fault and out and call == FAULTY:
            mean, std = mean * 1.01, std * 1.01
        lines.append(
            {
                "key": f"{module}.0.forward.{role}.0",
                "module": module,
                "module_type": "Linear",
                "call": 0,
                "phase": "forward",
                "role": role,
                "index": 0,
                "name": "output" if out else "args.0",
                "step": 0,
                "rank": 0,
                "seq": seq,
                "dtype": "float32",
                "shape": [64, 64],
                "stats": {
                    "min": mean - 4 * std,
                    "max": mean + 4 * std,
                    "mean": mean,
                    "std": std,
                    "absmax": abs(mean) + 4 * std,
                    "l2": 64.0 * (std * std + mean * mean) ** 0.5,
                    "nan": 0,
                    "inf": 0,
                    "zeros": 0,
                    "numel": 4096,
                },
            }
        )
    text = "".join(json.dumps(line) + "\n" for line in lines)
    (path / "rank0" / "records.jsonl").write_text(text, encoding="utf-8")
    return path


def _parsed_bytes(path: Path) -> float:
    """Bytes one record takes held as parsed (a Record model), measured here."""
    lines = (path / "rank0" / "records.jsonl").read_bytes().splitlines()
    gc.collect()
    tracemalloc.start()
    try:
        held = [Record.model_validate_json(line) for line in lines]
        size = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del held
    return size / len(lines)


def _peak(golden: Path, actual: Path) -> tuple[int, precguard.Comparison]:
    """The peak memory compare_runs(golden, actual) allocates, and its result."""
    runs = precguard.load_run(golden), precguard.load_run(actual)  # opened, not sniffed
    gc.collect()
    tracemalloc.start()
    try:
        start = tracemalloc.get_traced_memory()[0]
        result = precguard.compare_runs(*runs)
        return tracemalloc.get_traced_memory()[1] - start, result
    finally:
        tracemalloc.stop()


def test_a_big_step_is_compared_in_less_memory_than_its_records_take(tmp_path: Path) -> None:
    sizes = {}
    for calls in (CALLS, 2 * CALLS):
        golden = _record_step(tmp_path / f"golden{calls}", fault=False, calls=calls)
        actual = _record_step(tmp_path / f"actual{calls}", fault=True, calls=calls)
        if not sizes:
            precguard.compare_runs(golden, actual)  # imports and caches, not measured
        sizes[calls], result = _peak(golden, actual)
        assert result.first_divergence is not None
        assert result.first_divergence.module == f"model.layers.{FAULTY // 4}.mlp.fc{FAULTY % 4}"
        assert len(result.records) == 2 * calls
    record = _parsed_bytes(golden)
    # memory per record pair: what the larger step took beyond the smaller (what every
    # comparison costs once cancels); holding both sides' parsed records alone would take
    # 2 * record a pair, and the streamed step holds neither side's, only each pair's result
    per_pair = (sizes[2 * CALLS] - sizes[CALLS]) / (2 * CALLS)
    assert per_pair < 2 * record, (per_pair, record)


def test_a_streamed_step_is_judged_as_one_aligned_in_memory(tmp_path: Path) -> None:
    golden = _record_step(tmp_path / "golden", fault=False)
    actual = _record_step(tmp_path / "actual", fault=True)
    streamed = precguard.compare_runs(golden, actual)
    # a --map rule (here renaming nothing) makes compare align the step as a whole
    aligned = precguard.compare_runs(
        golden, actual, CompareOptions(rename=("model.nothing=model.none",))
    )
    assert streamed.verdict == "diverged"
    assert streamed.model_dump_json() == aligned.model_dump_json()


def test_a_steps_records_are_held_as_offsets(tmp_path: Path) -> None:
    golden = _record_step(tmp_path / "golden", fault=False)
    run = precguard.load_run(golden)
    list(run.steps(0))  # what a first read caches (the rank folders), not measured
    gc.collect()
    tracemalloc.start()
    try:
        [step] = list(run.steps(0))
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert step.step == 0 and len(step) == 2 * CALLS
    # an offset and two hashes, 8 bytes each, in arrays that grow by at most an eighth
    # (plus the step object and its arrays' headers: under a kilobyte)
    assert held < 3 * 8 * 1.125 * len(step) + 1024 + 4096, held
    assert [r.key for r in step] == [r.key for r in run.records(0)]
    assert step[FAULTY].key == next(r.key for r in run.records(0) if r.seq == FAULTY)


def test_a_records_file_changed_under_a_streamed_step_is_refused(tmp_path: Path) -> None:
    golden = _record_step(tmp_path / "golden", fault=False)
    [step] = list(precguard.load_run(golden).steps(0))
    records = golden / "rank0" / "records.jsonl"
    records.write_bytes(records.read_bytes()[100:])  # cut while compare holds the step
    with pytest.raises(precguard.DumpFormatError, match="changed while it was read"):
        list(step)
