"""compare --layout on hand-written recordings: a 2-way column/row split against a whole golden."""

from __future__ import annotations

import json

import pytest
import torch

import precguard
from precguard import UsageError
from precguard.compare import Counts, IncomparableRunsError
from precguard.layout import LayoutSpec, gather_run, load_layout
from tests.compare.conftest import run_cli
from tests.layout.synth import TP_SPEC, split, weights, whole, write_run


@pytest.fixture
def spec_file(tmp_path):
    path = tmp_path / "tp.yaml"
    path.write_text(TP_SPEC)
    return path


def _runs(tmp_path, *, tensors=True, plant=None):
    x, w1, w2 = weights()
    golden = write_run(tmp_path / "golden", {0: whole(x, w1, w2)}, tensors=tensors)
    ranks = {r: split(x, w1, w2, r) for r in (0, 1)}
    if plant is not None:
        plant(ranks)
    actual = write_run(tmp_path / "actual", ranks, tensors=tensors)
    return golden, actual


def test_a_clean_split_run_matches_its_whole_golden(tmp_path, spec_file):
    golden, actual = _runs(tmp_path)
    result = precguard.compare_runs(golden, actual, layout=spec_file)
    assert result.verdict == "match"
    assert result.counts.passed == 6 and result.counts.full == 6
    assert result.actual == str(actual)  # the real recording, not the gathered view
    by_key = {r.key: r for r in result.records}
    assert by_key["row.0.forward.output.0"].metrics.level == "full"  # partials were added


def test_without_the_layout_the_shards_are_refused_with_a_pointer_to_it(tmp_path):
    golden, actual = _runs(tmp_path)
    with pytest.raises(IncomparableRunsError, match="--layout"):
        precguard.compare_runs(golden, actual)


def test_a_fault_in_rank_1s_row_shard_names_the_module_and_rank_1(tmp_path, spec_file, capsys):
    def plant(ranks):
        module, phase, role, index, name, w = ranks[1][4]
        ranks[1][4] = (module, phase, role, index, name, w * 1.05)

    golden, actual = _runs(tmp_path, plant=plant)
    result = precguard.compare_runs(golden, actual, layout=spec_file)
    first = result.first_divergence
    assert result.verdict == "diverged"
    assert (first.module, first.rank) == ("row", 1)
    assert "rank 1's part of parameter weight" in first.reason and "ranks [0] match" in first.reason
    # replay runs one rank's whole module: compare says so, not "no tensors"
    _, out, _ = run_cli(["compare", str(golden), str(actual), "--layout", str(spec_file)], capsys)
    assert "confirm it alone" not in out
    said = " ".join(out.split())  # wrapped at the terminal's width, never cut
    why = said[said.index("no replay command:") :].split(" top ")[0]
    assert "no full tensors" not in why and "rank 1" in why, why


def test_statistics_only_partial_sums_are_not_combinable_and_not_a_pass(tmp_path, spec_file):
    golden, actual = _runs(tmp_path, tensors=False)
    result = precguard.compare_runs(golden, actual, layout=spec_file)
    by_key = {r.key: r for r in result.records}
    partial = by_key["row.0.forward.output.0"]
    assert partial.status == "missing" and "not combinable" in partial.metrics.note
    assert by_key["col.0.forward.output.0"].status == "pass"  # shard statistics combine
    assert by_key["col.0.forward.output.0"].metrics.level == "stats"
    assert result.counts.passed == 5 and result.counts.missing == 1
    assert any("not combinable" in w for w in result.warnings)


def test_statistics_only_a_nan_in_one_shard_names_its_rank(tmp_path, spec_file):
    def plant(ranks):
        for r in (0, 1):
            module, phase, role, index, name, t = ranks[r][2]  # col output shard
            t = t.clone()
            if r == 1:
                t[0, 0] = float("nan")
            ranks[r][2] = (module, phase, role, index, name, t)

    golden, actual = _runs(tmp_path, tensors=False, plant=plant)
    result = precguard.compare_runs(golden, actual, layout=spec_file)
    assert (result.first_divergence.module, result.first_divergence.rank) == ("col", 1)


def test_a_layout_that_does_not_fit_the_shapes_exits_2_with_one_line(tmp_path, capsys):
    golden, actual = _runs(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("modules:\n  - match: col\n    kind: column\n    outputs: {shard: 2}\n")
    code, _, err = run_cli(["compare", str(golden), str(actual), "--layout", str(bad)], capsys)
    assert code == 2 and err.count("\n") == 1
    assert "do not concatenate" in err and "col" in err and "precguard-layout" not in err


def test_errors_from_the_gathered_view_name_the_real_recording(tmp_path, capsys):
    golden, actual = _runs(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text("modules:\n  - match: col\n    outputs: {shard: 0}\n")  # params left whole
    code, _, err = run_cli(["compare", str(golden), str(actual), "--layout", str(bad)], capsys)
    assert code == 2 and str(actual) in err and "precguard-layout" not in err


def test_split_parameters_the_layout_calls_replicated_are_pointed_out(tmp_path):
    _, actual = _runs(tmp_path)
    spec = LayoutSpec.model_validate({"modules": [{"match": "row", "kind": "row"}]})
    gathered = gather_run(actual, spec, tmp_path / "view")
    assert any("col" in w and "are they split" in w for w in gathered.warnings)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("modules: [{match: col, kind: diagonal}]", "modules.0.kind"),
        ("modules: [{match: col, outputs: {shard: x}}]", "modules.0.outputs"),
        ("pipeline_stages: 0", "pipeline_stages"),
        ("modules: [{match: col, colour: red}]", "colour"),
        ("- just a list", "mapping"),
        ("a: [", "YAML"),
    ],
)
def test_a_malformed_layout_is_refused_naming_the_field(tmp_path, capsys, text, expected):
    golden, actual = _runs(tmp_path)
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    code, _, err = run_cli(["compare", str(golden), str(actual), "--layout", str(bad)], capsys)
    assert code == 2 and expected in err and err.count("\n") == 1


def test_an_unknown_layout_lists_the_shipped_ones(tmp_path, capsys):
    golden, actual = _runs(tmp_path)
    code, _, err = run_cli(["compare", str(golden), str(actual), "--layout", "nope"], capsys)
    assert code == 2 and "megatron" in err and "llama" in err


def test_ranks_that_are_not_the_layouts_grid_are_refused(tmp_path):
    golden, actual = _runs(tmp_path)
    with pytest.raises(UsageError, match="pipeline stage"):
        precguard.compare_runs(golden, actual, layout=LayoutSpec(pipeline_stages=3))


def test_the_layout_schema_is_printed_by_precguard_schema(capsys):
    code, out, _ = run_cli(["schema", "layout"], capsys)
    schema = json.loads(out)
    assert code == 0 and "modules" in schema["properties"]
    assert "tensor_parallel" in schema["properties"]


def test_shipped_layouts_load_and_say_what_megatron_and_llama_split():
    megatron, llama = load_layout("megatron"), load_layout("llama")
    fc1 = "decoder.layers.3.mlp.linear_fc1"
    assert megatron.placement(fc1, "forward", "param", 0, "weight").shard == 0
    assert megatron.placement(fc1, "forward", "output", 0, "output").shard == -1
    assert megatron.placement(fc1, "backward", "input", 0, "args.0") == "replicate"
    proj = "decoder.layers.3.self_attention.linear_proj"
    assert megatron.placement(proj, "forward", "param", 0, "weight").shard == -1
    assert megatron.placement(proj, "forward", "input", 0, "args.0").shard == -1
    for name in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
        rule = llama.rule_for(f"model.layers.0.self_attn.{name}") or llama.rule_for(
            f"model.layers.0.mlp.{name}"
        )
        assert rule is not None and rule.kind == "column"
    assert llama.rule_for("model.layers.0.mlp.down_proj").kind == "row"
    assert llama.rule_for("model.layers.0.input_layernorm") is None  # replicated
    assert load_layout("fsdp2").placement("fc1", "backward", "grad", 0, "weight").shard == 0
    sp, norm = load_layout("megatron-sp"), "decoder.layers.0.input_layernorm"
    assert sp.placement(norm, "forward", "param", 0, "weight") == "replicate"
    assert sp.placement(norm, "backward", "grad", 0, "weight") == "partial"
    assert sp.placement(norm, "backward", "input", 0, "args.0").shard == 0


def test_pipeline_stages_merge_in_execution_order(tmp_path):
    """Forward: stage 0 then 1; backward: stage 1 then 0; the root's ends from the end stages."""
    t = torch.ones(2, 2)
    stage0 = [
        ("root", "forward", "input", 0, "args.0", t),
        ("a", "forward", "output", 0, "output", t),
        ("root", "forward", "output", 0, "output", t),
        ("root", "backward", "output", 0, "output", t),
        ("a", "backward", "output", 0, "output", t),
    ]
    stage1 = [
        ("root", "forward", "input", 0, "args.0", t),
        ("b", "forward", "output", 0, "output", t),
        ("root", "forward", "output", 0, "output", t),
        ("root", "backward", "output", 0, "output", t),
        ("b", "backward", "output", 0, "output", t),
        ("root", "backward", "input", 0, "args.0", t),
    ]
    run = write_run(tmp_path / "pp", {0: stage0, 1: stage1})
    gathered = gather_run(run, LayoutSpec(pipeline_stages=2), tmp_path / "view")
    order = [(r.module, r.phase, r.role) for r in gathered.run.records()]
    assert order == [
        ("root", "forward", "input"),  # stage 0's input: the model's
        ("a", "forward", "output"),
        ("b", "forward", "output"),
        ("root", "forward", "output"),  # stage 1's output: the model's
        ("root", "backward", "output"),  # the gradient of the model's output, from stage 1
        ("b", "backward", "output"),
        ("a", "backward", "output"),
    ]
    assert [r.seq for r in gathered.run.records()] == list(range(7))
    assert gathered.sources[(0, "b.0.forward.output.0")].ranks == (1,)


ATTN = "decoder.layers.0.self_attention"


@pytest.mark.parametrize(
    ("layout", "col", "row"),
    [
        ("megatron", "decoder.layers.0.mlp.linear_fc1", "decoder.layers.0.mlp.linear_fc2"),
        ("megatron", f"{ATTN}.linear_qkv", f"{ATTN}.linear_proj"),
        ("llama", "model.layers.0.mlp.up_proj", "model.layers.0.mlp.down_proj"),
        ("llama", "model.layers.0.self_attn.v_proj", "model.layers.0.self_attn.o_proj"),
    ],
)
def test_shipped_layouts_gather_their_frameworks_names(tmp_path, layout, col, row):
    """Megatron's and HF's row-parallel modules all-reduce their output themselves."""
    x, w1, w2 = weights()
    golden = write_run(tmp_path / "golden", {0: whole(x, w1, w2, col, row)})
    ranks = {r: split(x, w1, w2, r, col, row, reduced=True) for r in (0, 1)}
    module, phase, role, index, name, w = ranks[1][4]
    ranks[1][4] = (module, phase, role, index, name, w * 1.05)  # rank 1's row shard
    actual = write_run(tmp_path / "actual", ranks)
    result = precguard.compare_runs(golden, actual, layout=layout)
    assert (result.first_divergence.module, result.first_divergence.rank) == (row, 1)
    assert result.counts.missing == 0 and result.counts.full == 6


def test_data_parallel_replicas_other_than_the_first_are_not_read(tmp_path, spec_file):
    x, w1, w2 = weights()
    golden = write_run(tmp_path / "golden", {0: whole(x, w1, w2)})
    ranks = {r: split(x, w1, w2, r % 2) for r in range(4)}  # 2-way TP x 2 replicas
    ranks[3] = split(x, w1, w2 * 2, 1)  # a different replica 1 is not this layout's concern
    actual = write_run(tmp_path / "actual", ranks)
    spec = load_layout(spec_file).model_copy(update={"data_parallel": 2})
    result = precguard.compare_runs(golden, actual, layout=spec)
    assert result.verdict == "match" and result.counts.passed == 6
    assert any("replica 0 (ranks [0, 1])" in w for w in result.warnings)


def test_the_rank_grid_follows_megatrons_order():
    # tensor-parallel fastest, then data-parallel, then pipeline stage
    assert LayoutSpec(pipeline_stages=2, data_parallel=2).grid(8) == [[0, 1], [4, 5]]
    assert LayoutSpec(pipeline_stages=2).grid(4) == [[0, 1], [2, 3]]
    assert LayoutSpec(tensor_parallel=1, pipeline_stages=2).grid(2) == [[0], [1]]
    with pytest.raises(UsageError, match="data-parallel"):
        LayoutSpec(data_parallel=3).grid(4)


@pytest.mark.parametrize("tensors", [True, False])
def test_sequence_parallel_activations_are_split_along_the_sequence(tmp_path, tensors):
    """megatron-sp: a layer norm's [s, b, h] activations, half the sequence per rank."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(8, 2, 4, generator=g) * 3 + 1
    norm = "decoder.layers.0.input_layernorm"
    y = torch.nn.functional.layer_norm(x, (4,))
    items = [
        (norm, "forward", "input", 0, "args.0", x),
        (norm, "forward", "output", 0, "output", y),
    ]
    golden = write_run(tmp_path / "golden", {0: items}, tensors=tensors)
    ranks = {
        r: [(m, p, role, i, n, t.chunk(2, 0)[r]) for m, p, role, i, n, t in items] for r in (0, 1)
    }
    module, phase, role, index, name, t = ranks[1][1]
    ranks[1][1] = (module, phase, role, index, name, t * 1.1)  # rank 1's half of the output
    actual = write_run(tmp_path / "actual", ranks, tensors=tensors)
    result = precguard.compare_runs(golden, actual, layout="megatron-sp")
    records = {r.role: r for r in result.records}
    assert records["input"].status == "pass"  # the halves' statistics combine exactly
    assert records["output"].status == "fail"
    assert result.first_divergence.module == norm
    if tensors:  # which half is wrong needs the golden's halves
        assert result.first_divergence.rank == 1


def test_records_only_a_later_rank_of_the_group_has_are_reported(tmp_path, spec_file):
    def plant(ranks):
        ranks[1].append(("extra", "forward", "output", 0, "output", torch.ones(2)))

    golden, actual = _runs(tmp_path, plant=plant)
    result = precguard.compare_runs(golden, actual, layout=spec_file)
    assert any("rank 1" in w and "extra.0.forward.output.0" in w for w in result.warnings)


def test_the_golden_may_be_the_split_side(tmp_path, spec_file):
    x, w1, w2 = weights()
    golden = write_run(tmp_path / "golden", {r: split(x, w1, w2, r) for r in (0, 1)})
    actual = write_run(tmp_path / "actual", {0: whole(x, w1 * 1.05, w2)})
    result = precguard.compare_runs(golden, actual, layout=spec_file)
    assert result.verdict == "diverged" and result.first_divergence.module == "col"
    assert result.golden == str(golden) and result.counts.full == 6


def test_replay_is_refused_with_a_layout(tmp_path, capsys, spec_file):
    golden, actual = _runs(tmp_path)
    args = ["compare", str(golden), str(actual), "--layout", str(spec_file)]
    code, _, err = run_cli([*args, "--replay", "--target", "x.py"], capsys)
    assert code == 2 and "--replay cannot be used with --layout" in err


def test_both_paths_count_records_the_same_way(tmp_path, spec_file):
    # compare and compare --layout count with one function (Counts.of): a plain comparison
    # and a gathered one of the same whole recordings give the same counts, and a gathered
    # comparison's counts are those of its records (a pass it could not combine is missing,
    # at no level, although it carries metrics)
    x, w1, w2 = weights()
    golden = write_run(tmp_path / "g", {0: whole(x, w1, w2)}, tensors=False)
    actual = write_run(tmp_path / "a", {0: whole(x, w1 * 1.01, w2)}, tensors=False)
    plain = precguard.compare_runs(golden, actual)
    gathered = precguard.compare_runs(golden, actual, layout=spec_file)
    assert plain.counts == gathered.counts == Counts.of(plain.records)
    assert plain.counts.failed > 0 and plain.counts.stats_only == len(plain.records)

    golden, actual = _runs(tmp_path / "split", tensors=False)
    split_result = precguard.compare_runs(golden, actual, layout=spec_file)
    assert split_result.counts == Counts.of(split_result.records)
    assert split_result.counts.missing == 1
    assert split_result.counts.stats_only == len(split_result.records) - 1


def test_calibration_goes_with_a_gathered_actual_not_with_a_gathered_golden(tmp_path, spec_file):
    golden, actual = _runs(tmp_path)
    calibration = write_run(tmp_path / "cal", {0: whole(*weights())})  # golden's own numbers
    plain = precguard.compare_runs(golden, actual, layout=spec_file)
    calibrated = precguard.compare_runs(golden, actual, layout=spec_file, calibration=calibration)
    assert calibrated.verdict == plain.verdict == "match"
    assert calibrated.counts == plain.counts
    with pytest.raises(UsageError, match="--calibration cannot be used with --layout"):
        precguard.compare_runs(actual, golden, layout=spec_file, calibration=calibration)
