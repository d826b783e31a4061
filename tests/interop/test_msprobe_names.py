"""msprobe names and folders onto precguard keys, ranks and capture order."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from precguard import load_run
from precguard.interop.msprobe import find_rank_dumps, import_msprobe, is_msprobe_dump, parse_name

FIXTURES = Path(__file__).parent / "fixtures" / "msprobe"


@pytest.mark.parametrize(
    ("name", "kind", "module", "module_type", "phase", "count"),
    [
        ("Module.model.layers.0.mlp.LlamaMLP.forward.0", "module", "model.layers.0.mlp",
         "LlamaMLP", "forward", 0),
        ("Module.lm_head.Linear.backward.2", "module", "lm_head", "Linear", "backward", 2),
        ("Module.LlamaForCausalLM.forward.0", "module", "root", "LlamaForCausalLM", "forward", 0),
        ("Module.model.norm.LlamaRMSNorm.parameters_grad.0", "param_grad", "model.norm",
         "LlamaRMSNorm", "backward", 0),
        ("Module.model.norm.LlamaRMSNorm.parameters_grad", "param_grad", "model.norm",
         "LlamaRMSNorm", "backward", 0),
        ("Functional.linear.3.forward", "api", "msprobe_api.Functional.linear",
         "Functional.linear", "forward", 3),
        ("Tensor.__add__.0.backward", "api", "msprobe_api.Tensor.__add__", "Tensor.__add__",
         "backward", 0),
        ("Aten.add.Tensor.7.forward", "api", "msprobe_api.Aten.add.Tensor", "Aten.add.Tensor",
         "forward", 7),
    ],
)  # fmt: skip
def test_names_map_onto_precguard_modules(name, kind, module, module_type, phase, count) -> None:
    parsed = parse_name(name)
    assert parsed is not None
    assert (parsed.kind, parsed.module, parsed.module_type, parsed.phase, parsed.count) == (
        kind, module, module_type, phase, count,
    )  # fmt: skip


@pytest.mark.parametrize(
    "name",
    ["Module.forward.0", "Module.a.B.forward.x", "Functional.linear.forward", "x", "a..b.0.forward",
     "Module.a/b.C.forward.0", "Functional.lin ear.0.forward"],
)  # fmt: skip
def test_other_names_are_not_calls(name) -> None:
    assert parse_name(name) is None


def test_records_follow_precguard_capture_order(tmp_path) -> None:
    run = load_run(import_msprobe(FIXTURES / "stats", tmp_path / "run"))
    seq = {r.key: r.seq for r in run.records()}
    mlp = "model.layers.0.mlp"
    # a module's inputs before its children, its outputs after them
    assert seq[f"{mlp}.0.forward.input.0"] < seq[f"{mlp}.gate_proj.0.forward.input.0"]
    assert seq[f"{mlp}.down_proj.0.forward.output.0"] < seq[f"{mlp}.0.forward.output.0"]
    assert seq["model.0.forward.input.0"] < seq["model.embed_tokens.0.forward.input.0"]
    # siblings in the order they ran
    assert seq[f"{mlp}.gate_proj.0.forward.output.0"] < seq[f"{mlp}.up_proj.0.forward.input.0"]


def test_order_without_construct_json_comes_from_module_paths(tmp_path) -> None:
    with_tree = load_run(import_msprobe(FIXTURES / "stats", tmp_path / "a"))
    dump = shutil.copytree(FIXTURES / "stats", tmp_path / "dump")
    (dump / "step0" / "proc4242" / "construct.json").unlink()
    without = load_run(import_msprobe(dump, tmp_path / "b"))
    assert [r.key for r in with_tree.records()] == [r.key for r in without.records()]


def test_proc_folders_take_the_ranks_after_the_rank_folders(tmp_path) -> None:
    step = tmp_path / "dump" / "step3"
    src = FIXTURES / "stats" / "step0" / "proc4242"
    for name in ("rank0", "rank1", "proc900", "proc77"):
        shutil.copytree(src, step / name)
    dumps = find_rank_dumps(tmp_path / "dump")
    assert [(d.rank, d.rel) for d in dumps] == [
        (0, "step3/rank0"), (1, "step3/rank1"), (2, "step3/proc77"), (3, "step3/proc900"),
    ]  # fmt: skip
    assert {d.step for d in dumps} == {3}
    # the three levels a dump can be named at
    assert is_msprobe_dump(tmp_path / "dump")
    assert is_msprobe_dump(step)
    assert is_msprobe_dump(step / "rank1")
    assert find_rank_dumps(step / "rank1")[0].rank == 1
    assert find_rank_dumps(step / "rank1")[0].step == 3


def test_statistics_msprobe_does_not_measure_stay_unknown(tmp_path) -> None:
    run = load_run(import_msprobe(FIXTURES / "stats", tmp_path / "run"))
    raw = json.loads((FIXTURES / "stats" / "step0" / "proc4242" / "dump.json").read_text())
    entry = raw["data"]["Module.model.layers.0.mlp.LlamaMLP.forward.0"]["output"][0]
    rec = next(r for r in run.records() if r.key == "model.layers.0.mlp.0.forward.output.0")
    assert rec.stats is not None
    assert (rec.stats.max, rec.stats.min, rec.stats.mean, rec.stats.l2) == (
        entry["Max"], entry["Min"], entry["Mean"], entry["Norm"],
    )  # fmt: skip
    assert rec.stats.absmax == max(abs(entry["Max"]), abs(entry["Min"]))
    assert rec.stats.std is None and rec.stats.nan is None and rec.stats.zeros is None
    ids = next(r for r in run.records() if r.key == "model.embed_tokens.0.forward.input.0")
    assert ids.dtype == "int64" and ids.stats is not None and ids.stats.mean is None


def test_ranks_and_steps_are_kept_and_api_calls_counted_per_step(tmp_path) -> None:
    # msprobe counts API calls over the process: step 1's first linear is Functional.linear.N
    src = FIXTURES / "mix" / "step0" / "proc4242"
    raw = json.loads((src / "dump.json").read_text())
    per_api: dict[str, int] = {}
    for name in raw["data"]:
        if not name.startswith("Module."):
            api = name.rsplit(".", 2)[0]
            per_api[api] = per_api.get(api, 0) + 1

    def renamed(name: str | None) -> str | None:
        if name is None or name.startswith("Module."):
            return name
        api, count, phase = name.rsplit(".", 2)
        return f"{api}.{int(count) + per_api.get(api, 0)}.{phase}"

    later = dict(raw, data={renamed(k): v for k, v in raw["data"].items()})
    tree = json.loads((src / "construct.json").read_text())
    later_tree = {renamed(k): renamed(v) for k, v in tree.items()}
    dump = tmp_path / "dump"
    for rank in ("rank0", "rank1"):
        shutil.copytree(src, dump / "step0" / rank)
        (dump / "step1" / rank).mkdir(parents=True)
        (dump / "step1" / rank / "dump.json").write_text(json.dumps(later))
        (dump / "step1" / rank / "construct.json").write_text(json.dumps(later_tree))

    run = load_run(import_msprobe(dump, tmp_path / "run"))

    assert run.ranks == [0, 1]
    assert run.manifest.world_size == 2 and run.manifest.steps == 2
    for rank in run.ranks:
        steps: dict[int, list[str]] = {}
        for rec in run.records(rank):
            assert rec.rank == rank
            steps.setdefault(rec.step, []).append(rec.key)
        assert sorted(steps) == [0, 1]
        assert steps[0] == steps[1]  # the same calls, the same keys, in both steps
        assert "msprobe_api.Functional.linear.0.forward.output.0" in steps[1]


def test_one_rank_folder_alone_keeps_its_rank_and_gets_a_manifest(tmp_path) -> None:
    folder = shutil.copytree(
        FIXTURES / "stats" / "step0" / "proc4242", tmp_path / "step2" / "rank1"
    )
    run = load_run(import_msprobe(folder, tmp_path / "run"))
    assert run.ranks == [1]
    assert run.manifest.complete and run.manifest.world_size == 2
    assert {r.step for r in run.records()} == {2}
