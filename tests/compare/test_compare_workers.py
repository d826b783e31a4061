"""compare --workers N: the same result as one process, whatever the share-out."""

from __future__ import annotations

import json

import pytest
import torch

import precguard
from precguard import DumpFormatError
from precguard.compare.parallel import owner
from precguard.dump.writer import RunWriter, prepare_run_dir
from tests.distributed.synthetic import stats_of


@pytest.mark.parametrize(("n_ranks", "count"), [(1, 1), (1, 3), (2, 3), (3, 2), (8, 3), (4, 4)])
def test_every_unit_has_exactly_one_owner_and_every_owner_some_unit(n_ranks, count):
    steps = range(6)
    owners = {(i, s): owner(i, s, n_ranks, count) for i in range(n_ranks) for s in steps}
    assert all(0 <= o < count for o in owners.values())
    assert set(owners.values()) == set(range(min(count, n_ranks * len(steps))))


def write_pair(root, *, ranks=3, steps=3, fault=(2, 1), golden_extra_step=True):
    """Golden and actual of ``ranks`` ranks; actual scaled by 1.05 at ``fault`` (rank, step)."""
    paths = []
    for side in ("golden", "actual"):
        path = prepare_run_dir(root / side)
        for rank in range(ranks):
            w = RunWriter(path, rank=rank, world_size=ranks, model="Synthetic")
            seq = 0
            n_steps = steps + (side == "golden" and golden_extra_step)
            for step in range(n_steps):
                gen = torch.Generator().manual_seed(1000 * rank + step)
                x = torch.randn(64, generator=gen)
                recs = []
                for layer in range(4):
                    x = torch.tanh(x * 1.1 + layer)
                    y = x * 1.05 if side == "actual" and (rank, step) == fault and layer else x
                    module = f"model.layers.{layer}"
                    recs.append({"key": f"{module}.0.forward.output.0", "module": module,
                                 "module_type": "Block", "call": 0, "phase": "forward",
                                 "role": "output", "index": 0, "step": step, "rank": rank,
                                 "seq": seq, "dtype": "float32", "shape": [64],
                                 "stats": stats_of(y)})  # fmt: skip
                    seq += 1
                w.write_records(recs)
            w.close(steps=n_steps)
        paths.append(path)
    return paths


@pytest.mark.parametrize("workers", [2, 4])
def test_workers_give_the_same_json_as_one_process(tmp_path, workers):
    golden, actual = write_pair(tmp_path)
    one = precguard.compare_runs(golden, actual)
    many = precguard.compare_runs(golden, actual, workers=workers)
    assert one.verdict == "diverged" and one.first_divergence.rank == 2
    assert any("only in golden" in w for w in one.warnings)  # pairing warnings kept in order
    assert many.model_dump_json() == one.model_dump_json()


def test_an_error_in_a_worker_reaches_the_user_as_the_same_error(tmp_path):
    golden, actual = write_pair(tmp_path, golden_extra_step=False)
    bad = actual / "rank2" / "records.jsonl"
    bad.write_text(bad.read_text().replace('"seq":1,', '"seq":0,', 1))
    with pytest.raises(DumpFormatError) as one:
        precguard.compare_runs(golden, actual)
    with pytest.raises(DumpFormatError) as many:
        precguard.compare_runs(golden, actual, workers=3)
    assert str(one.value) == str(many.value) and "rank2" in str(many.value)


def test_the_cli_takes_workers(tmp_path, capsys):
    from precguard.cli import main

    golden, actual = write_pair(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(["compare", str(golden), str(actual), "--workers", "2", "--json", "-"])
    assert info.value.code == 1
    assert json.loads(capsys.readouterr().out)["first_divergence"]["rank"] == 2


def test_a_share_is_the_json_of_the_very_model_merged(tmp_path):
    # a worker's share is the ShardResult model itself as JSON: it comes back equal,
    # every field included (collectives left out too), and the unit's first divergence
    # is its first candidate again, the same object, as in the process that compared it
    from precguard.compare.engine import compare_shard, plan_comparison
    from precguard.compare.units import ShardResult

    golden, actual = write_pair(tmp_path)
    plan = plan_comparison(golden, actual)
    shard = compare_shard(plan, lambda _r, _s: True)
    shard.units[0] = shard.units[0].model_copy(update={"collectives_dropped": (3, 0)})
    back = ShardResult.model_validate_json(shard.model_dump_json(exclude_defaults=True))
    assert back == shard
    faulty = next(u for u in back.units if u.candidates)
    assert (faulty.rank, faulty.step) == (2, 1) and faulty.first is faulty.candidates[0]
    assert back.units[0].collectives_dropped == (3, 0)
