"""msprobe dumps as either side of compare: the user's story with real msprobe output.

The fixtures under fixtures/msprobe/ were written by mindstudio-probe 26.2.0
itself (see fixtures/make_msprobe_fixtures.py) for the model of
llama_two_tools.py. Here precguard records the same model and compares it with
them both ways: the clean dumps match, the dump with the planted fault (layer
1's SiLU rounded to bf16) names that module, and so does a clean dump against a
faulty precguard run.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import precguard
from precguard.compare import IncomparableRunsError
from precguard.interop.msprobe import open_recording
from tests.compare.conftest import run_cli
from tests.interop.llama_two_tools import FAULTY_MODULE, build_model, run_step

FIXTURES = Path(__file__).parent / "fixtures" / "msprobe"


def _record(out: Path, *, fault: bool = False, backward: bool = False) -> Path:
    model, ids = build_model(fault)
    model.train(backward)
    tensors = ["model.layers.1.mlp*"]
    with precguard.monitor(model, out=out, tensors=tensors, backward=backward):
        run_step(model, ids, backward)
    return out


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("pg")
    return {
        "clean": _record(base / "clean"),
        "fault": _record(base / "fault", fault=True),
        "backward": _record(base / "backward", backward=True),
    }


def _compare(golden: Path, actual: Path) -> precguard.compare.Comparison:
    return precguard.compare_runs(open_recording(golden), open_recording(actual))


@pytest.mark.parametrize("dump", ["stats", "tensor"])
def test_clean_msprobe_dump_matches_precguard_both_ways(runs, dump: str) -> None:
    for golden, actual in ((runs["clean"], FIXTURES / dump), (FIXTURES / dump, runs["clean"])):
        result = _compare(golden, actual)
        assert result.verdict == "match", result.first_divergence
        # every module record msprobe dumps (L0: all but the root model) was paired
        assert result.counts.passed >= 90
        assert result.counts.missing == 2  # precguard's root input and output
        assert {
            k.split(".")[0] for k in result.unmatched.golden_only + result.unmatched.actual_only
        } == {"root"}


def test_tensor_dump_is_compared_on_full_tensors_where_it_saved_them(runs) -> None:
    result = _compare(runs["clean"], FIXTURES / "tensor")
    full = {r.key for r in result.records if r.metrics is not None and r.metrics.level != "stats"}
    # the fixture keeps the tensors of layer 1's MLP (as .npy): 13, compared element-wise
    assert len(full) == 13
    assert all(k.startswith("model.layers.1.mlp.") for k in full)


@pytest.mark.parametrize(
    ("golden", "actual"),
    [("clean", "stats_fault"), ("stats", "fault"), ("tensor", "fault")],
    ids=["msprobe-faulty", "precguard-faulty-vs-msprobe-stats", "vs-msprobe-tensors"],
)
def test_planted_fault_is_named_whichever_side_msprobe_is(runs, golden, actual) -> None:
    def side(name: str) -> Path:
        return runs[name] if name in runs else FIXTURES / name

    result = _compare(side(golden), side(actual))
    assert result.verdict == "diverged"
    first = result.first_divergence
    assert first is not None
    assert first.module == FAULTY_MODULE
    assert first.key == f"{FAULTY_MODULE}.0.forward.output.0"
    assert first.local is True
    # nothing upstream of the fault failed
    failed = [r for r in result.records if r.status == "fail"]
    assert min(r.seq for r in failed) == next(r.seq for r in failed if r.key == first.key)


def test_backward_dump_pairs_gradients(runs) -> None:
    result = _compare(runs["backward"], FIXTURES / "stats_backward")
    assert result.verdict == "match", result.first_divergence
    backward = [r for r in result.records if r.phase == "backward" and r.status == "pass"]
    roles = {r.role for r in backward}
    # gradients of module outputs and inputs, and of the parameters, all paired
    assert roles == {"output", "input", "grad"}
    assert len(backward) > 60


def test_compare_cli_reads_an_msprobe_dump_and_names_it(runs, capsys, tmp_path) -> None:
    out = tmp_path / "result.json"
    code, stdout, err = run_cli(
        ["compare", str(runs["clean"]), str(FIXTURES / "stats_fault"), "--json", str(out)], capsys
    )
    assert code == 1, err
    result = json.loads(out.read_text())
    assert result["actual"] == str(FIXTURES / "stats_fault")  # not a temporary copy
    assert result["first_divergence"]["module"] == FAULTY_MODULE
    assert FAULTY_MODULE in stdout


def test_import_msprobe_writes_a_recording_every_command_reads(runs, capsys, tmp_path) -> None:
    dest = tmp_path / "imported"
    code, stdout, err = run_cli(
        ["import-msprobe", str(FIXTURES / "tensor"), "--out", str(dest)], capsys
    )
    assert code == 0, err
    assert "tensors: yes" in stdout
    manifest = json.loads((dest / "manifest.json").read_text())
    assert manifest["device"] == "msprobe"
    assert manifest["options"]["source"] == "msprobe"
    assert manifest["options"]["msprobe_task"] == "tensor"
    assert list((dest / "rank0").glob("*.safetensors"))
    code, _, err = run_cli(["compare", str(runs["clean"]), str(dest)], capsys)
    assert code == 0, err

    # never overwritten without --overwrite
    code, _, err = run_cli(["import-msprobe", str(FIXTURES / "stats"), "--out", str(dest)], capsys)
    assert code == 2 and "--overwrite" in err
    code, _, err = run_cli(
        ["import-msprobe", str(FIXTURES / "stats"), "--out", str(dest), "--overwrite"], capsys
    )
    assert code == 0, err
    assert not list((dest / "rank0").glob("*.safetensors"))


def test_two_imports_of_one_dump_are_the_same_run(capsys, tmp_path) -> None:
    for name in ("a", "b"):
        code, _, err = run_cli(
            ["import-msprobe", str(FIXTURES / "stats"), "--out", str(tmp_path / name)], capsys
        )
        assert code == 0, err
    code, _, err = run_cli(["compare", str(tmp_path / "a"), str(tmp_path / "b")], capsys)
    assert code == 2 and "same recording" in err


def test_mix_level_api_records_are_listed_unmatched_against_precguard(runs) -> None:
    result = _compare(runs["clean"], FIXTURES / "mix")
    # the API calls (Functional.linear, Tensor.__mul__, ...) have no precguard counterpart:
    # listed, not a reason to call the recordings different models
    assert result.verdict == "match", result.first_divergence
    api = result.unmatched.actual_only
    assert len(api) > 50
    assert {k.split(".")[0] for k in api} == {"msprobe_api"}
    assert any(k.startswith("msprobe_api.Functional.linear.0.forward.") for k in api)
    assert result.counts.passed >= 90


def test_two_msprobe_dumps_compare_module_records_and_name_the_fault() -> None:
    result = _compare(FIXTURES / "mix", FIXTURES / "stats_fault")
    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    assert result.first_divergence.module == FAULTY_MODULE


def test_api_records_pair_between_two_msprobe_dumps(tmp_path) -> None:
    edited = shutil.copytree(FIXTURES / "mix", tmp_path / "mix_fault")
    path = edited / "step0" / "proc4242" / "dump.json"
    dump = json.loads(path.read_text())
    # plant a fault in the API call: layer 1's SiLU output 1 % larger
    out = dump["data"]["Functional.silu.1.forward"]["output"][0]
    for stat in ("Max", "Min", "Mean", "Norm"):
        out[stat] *= 1.01
    path.write_text(json.dumps(dump))

    result = _compare(FIXTURES / "mix", edited)

    api_pairs = [r for r in result.records if r.module.startswith("msprobe_api.")]
    assert len(api_pairs) > 50 and not result.unmatched.golden_only
    assert result.verdict == "diverged"
    assert result.first_divergence is not None
    assert result.first_divergence.key == "msprobe_api.Functional.silu.1.forward.output.0"


def test_an_api_only_dump_against_precguard_says_which_level_to_dump(runs, tmp_path, capsys):
    l1 = shutil.copytree(FIXTURES / "mix", tmp_path / "l1")
    path = l1 / "step0" / "proc4242" / "dump.json"
    dump = json.loads(path.read_text())
    # what level L1 writes: the API calls without the modules
    dump["data"] = {k: v for k, v in dump["data"].items() if not k.startswith("Module.")}
    dump["level"] = "L1"
    path.write_text(json.dumps(dump))
    code, _, err = run_cli(["compare", str(runs["clean"]), str(l1)], capsys)
    assert code == 2
    assert "msprobe L1 dump" in err and "level L0 or mix" in err


def test_compare_runs_takes_an_msprobe_dump_from_python_as_the_cli_does(runs, capsys, tmp_path):
    # no open_recording needed: compare_runs converts the dump itself, names it as given,
    # and gives the result the CLI writes
    dump = FIXTURES / "stats_fault"
    result = precguard.compare_runs(runs["clean"], dump)
    assert result.verdict == "diverged" and result.first_divergence.module == FAULTY_MODULE
    assert (result.golden, result.actual) == (str(runs["clean"]), str(dump))
    out = tmp_path / "cli.json"
    code, _, err = run_cli(["compare", str(runs["clean"]), str(dump), "--json", str(out)], capsys)
    assert code == 1, err
    assert json.loads(out.read_text()) == json.loads(result.model_dump_json())
    backwards = precguard.compare_runs(dump, runs["clean"])
    assert (backwards.golden, backwards.actual) == (str(dump), str(runs["clean"]))


def test_an_error_from_python_names_the_dump_not_its_temporary_copy(runs, tmp_path):
    l1 = shutil.copytree(FIXTURES / "mix", tmp_path / "l1")
    path = l1 / "step0" / "proc4242" / "dump.json"
    dump = json.loads(path.read_text())
    dump["data"] = {k: v for k, v in dump["data"].items() if not k.startswith("Module.")}
    path.write_text(json.dumps(dump))
    with pytest.raises(IncomparableRunsError) as info:
        precguard.compare_runs(runs["clean"], l1)
    message = str(info.value)
    assert "msprobe L1 dump" in message and f"{l1} (msprobe dump)" in message
    assert "precguard-msprobe-" not in message
