"""An msprobe dump someone sends is untrusted: refused with one line and exit 2, no code run."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from tests.compare.conftest import run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "msprobe"
RANK = Path("step0") / "proc4242"
MLP_OUT = "Module.model.layers.1.mlp.LlamaMLP.forward.0"


def _copy(name: str, tmp_path: Path) -> tuple[Path, Path, dict]:
    """A copy of a fixture dump, its tensors in msprobe's own form: ``.pt`` files.

    The repository keeps them as ``.npy`` (no pickle is tracked); msprobe writes
    ``torch.save`` files, so the copy turns each back into one.
    """
    dest = shutil.copytree(FIXTURES / name, tmp_path / name)
    dump = json.loads((dest / RANK / "dump.json").read_text())
    for npy in sorted((dest / RANK).glob("dump_tensor_data/*.npy")):
        torch.save(torch.from_numpy(np.load(npy, allow_pickle=False)), npy.with_suffix(".pt"))
        npy.unlink()
    if any(True for _ in (dest / RANK).glob("dump_tensor_data/*.pt")):
        text = json.dumps(dump).replace('.npy"', '.pt"')
        dump = json.loads(text)
        _save(dest / RANK, dump)
    return dest, dest / RANK, dump


def _save(rank_dir: Path, dump: dict) -> None:
    (rank_dir / "dump.json").write_text(json.dumps(dump))


def _import_fails(src: Path, tmp_path: Path, capsys) -> str:
    code, _, err = run_cli(["import-msprobe", str(src), "--out", str(tmp_path / "out")], capsys)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("precguard: error: "), err
    assert not (tmp_path / "out").exists()  # nothing half-written is left behind
    return lines[0]


class _Payload:
    """Unpickling this would create a marker file (what a malicious pickle does)."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (Path(self.marker),))


def test_pt_file_holding_a_pickled_object_is_refused_and_never_run(tmp_path, capsys) -> None:
    dump_dir, rank_dir, _ = _copy("tensor", tmp_path)
    marker = tmp_path / "pwned"
    target = rank_dir / "dump_tensor_data" / f"{MLP_OUT}.output.0.pt"
    with open(target, "wb") as fh:
        torch.save({"x": _Payload(str(marker))}, fh)

    line = _import_fails(dump_dir, tmp_path, capsys)

    assert "weights_only=True" in line and "refused" in line
    assert not marker.exists()


def test_pt_file_with_another_shape_than_its_record_is_refused(tmp_path, capsys) -> None:
    dump_dir, rank_dir, _ = _copy("tensor", tmp_path)
    torch.save(torch.zeros(3), rank_dir / "dump_tensor_data" / f"{MLP_OUT}.output.0.pt")
    line = _import_fails(dump_dir, tmp_path, capsys)
    assert "shape [3]" in line and "record says" in line


def test_npy_is_read_without_pickle(tmp_path, capsys) -> None:
    dump_dir, rank_dir, dump = _copy("tensor", tmp_path)
    entry = dump["data"][MLP_OUT]["output"][0]
    pt = rank_dir / "dump_tensor_data" / entry["data_name"]
    value = torch.load(pt, weights_only=True)
    pt.unlink()
    entry["data_name"] = entry["data_name"].replace(".pt", ".npy")
    np.save(rank_dir / "dump_tensor_data" / entry["data_name"], value.numpy())
    _save(rank_dir, dump)
    code, _, err = run_cli(["import-msprobe", str(dump_dir), "--out", str(tmp_path / "ok")], capsys)
    assert code == 0, err

    np.save(
        rank_dir / "dump_tensor_data" / entry["data_name"],
        np.array([{"a": 1}], dtype=object),
        allow_pickle=True,
    )
    line = _import_fails(dump_dir, tmp_path, capsys)
    assert "allow_pickle=False" in line


@pytest.mark.parametrize(
    ("data_name", "expected"),
    [
        ("x.pkl", "unsupported type .pkl"),
        ("x.pth.tar", "unsupported type"),
        ("../../../../etc/passwd.pt", "not a plain file name"),
        ("/etc/passwd.pt", "not a plain file name"),
    ],
)
def test_tensor_file_names_are_confined_and_typed(tmp_path, capsys, data_name, expected) -> None:
    dump_dir, rank_dir, dump = _copy("tensor", tmp_path)
    dump["data"][MLP_OUT]["output"][0]["data_name"] = data_name
    _save(rank_dir, dump)
    line = _import_fails(dump_dir, tmp_path, capsys)
    assert expected in line


def test_tensor_file_linked_outside_the_dump_is_refused(tmp_path, capsys) -> None:
    dump_dir, rank_dir, dump = _copy("tensor", tmp_path)
    outside = tmp_path / "outside.pt"
    torch.save(torch.zeros(1), outside)
    target = rank_dir / "dump_tensor_data" / dump["data"][MLP_OUT]["output"][0]["data_name"]
    target.unlink()
    os.symlink(outside, target)
    line = _import_fails(dump_dir, tmp_path, capsys)
    assert "leads outside" in line


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.pop("data"), "no 'data' object"),
        (lambda d: d.update(task="overflow_check"), "task 'overflow_check'"),
        (lambda d: d.update(framework="mindspore"), "only msprobe's PyTorch dumps"),
        (lambda d: d["data"][MLP_OUT]["output"][0].update(shape="big"), "not a list of sizes"),
        (lambda d: d["data"][MLP_OUT]["output"][0].update(dtype="torch.fp9"), "unknown dtype"),
        (lambda d: d["data"][MLP_OUT]["output"][0].update(Max=[1]), "Max is [1]"),
        (lambda d: d["data"].update({MLP_OUT: [1, 2]}), "is not a JSON object"),
    ],
)
def test_malformed_dump_json_is_one_line_and_exit_2(tmp_path, capsys, edit, expected) -> None:
    dump_dir, rank_dir, dump = _copy("stats", tmp_path)
    edit(dump)
    _save(rank_dir, dump)
    line = _import_fails(dump_dir, tmp_path, capsys)
    assert expected in line and "dump.json" in line


def test_compare_refuses_a_malformed_msprobe_side_in_one_line(tmp_path, capsys) -> None:
    dump_dir, rank_dir, _ = _copy("stats", tmp_path)
    (rank_dir / "dump.json").write_text('{"task": "statistics", "data": {')
    golden, _, _ = _copy("stats_fault", tmp_path)
    code, _, err = run_cli(["compare", str(golden), str(dump_dir)], capsys)
    assert code == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "not valid JSON" in lines[0]


def test_a_directory_without_dump_json_is_no_msprobe_dump(tmp_path, capsys) -> None:
    (tmp_path / "empty").mkdir()
    line = _import_fails(tmp_path / "empty", tmp_path, capsys)
    assert "no msprobe dump.json" in line


def test_a_cycle_in_construct_json_is_refused_not_dropped(tmp_path, capsys) -> None:
    dump_dir, rank_dir, _ = _copy("stats", tmp_path)
    tree = json.loads((rank_dir / "construct.json").read_text())
    a, b = MLP_OUT, "Module.model.layers.1.LlamaDecoderLayer.forward.0"
    tree[a], tree[b] = b, a
    (rank_dir / "construct.json").write_text(json.dumps(tree))
    line = _import_fails(dump_dir, tmp_path, capsys)
    assert "construct.json" in line and "cycle" in line


def test_a_failed_overwrite_leaves_no_half_recording(tmp_path, capsys) -> None:
    out = tmp_path / "out"
    code, _, err = run_cli(["import-msprobe", str(FIXTURES / "stats"), "--out", str(out)], capsys)
    assert code == 0, err
    dump_dir, rank_dir, _ = _copy("tensor", tmp_path)
    torch.save(torch.zeros(3), rank_dir / "dump_tensor_data" / f"{MLP_OUT}.output.0.pt")
    code, _, err = run_cli(
        ["import-msprobe", str(dump_dir), "--out", str(out), "--overwrite"], capsys
    )
    assert code == 2, err
    assert not (out / "manifest.json").exists() and not (out / "rank0").exists()
