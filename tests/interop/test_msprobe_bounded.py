"""msprobe dumps that would crash or exhaust the import: refused or normalised, in one line."""

from __future__ import annotations

import json
import shutil
import zipfile
from pathlib import Path

import numpy as np
import torch

import precguard
from tests.compare.conftest import run_cli
from tests.interop.test_msprobe_untrusted import (
    FIXTURES,
    MLP_OUT,
    RANK,
    _copy,
    _import_fails,
    _save,
)


def test_a_401_digit_max_is_refused_not_overflowed(tmp_path, capsys) -> None:
    dump_dir, rank_dir, dump = _copy("stats", tmp_path)
    # json.dumps writes the int whole; float() of it would raise OverflowError
    dump["data"][MLP_OUT]["output"][0]["Max"] = 10**400
    _save(rank_dir, dump)
    line = _import_fails(dump_dir, tmp_path, capsys)
    assert "Max is an integer of 401 digits" in line


def test_a_big_endian_npy_reads_as_the_same_numbers(tmp_path: Path) -> None:
    # msprobe's numpy mode writes .npy files; one written on a big-endian host
    little = FIXTURES / "tensor"
    big = shutil.copytree(little, tmp_path / "big-endian")
    npys = sorted((big / RANK).glob("dump_tensor_data/*.npy"))
    for npy in npys:
        values = np.load(npy, allow_pickle=False)
        np.save(npy, values.astype(values.dtype.newbyteorder(">")))
    assert npys and np.load(npys[0]).dtype.byteorder == ">"
    want = precguard.load_run(precguard.import_msprobe(little, tmp_path / "little-run"))
    got = precguard.load_run(precguard.import_msprobe(big, tmp_path / "big-run"))
    pairs = [
        (want.tensor(w), got.tensor(g))
        for w, g in zip(want.records(), got.records(), strict=True)
        if w.tensor is not None
    ]
    assert pairs and all(torch.equal(w, g) for w, g in pairs)


def test_a_deflated_pt_is_refused_before_it_is_inflated(tmp_path: Path, capsys) -> None:
    dump_dir, rank_dir, dump = _copy("tensor", tmp_path)
    output = dump["data"][MLP_OUT]["output"][0]  # a [1, 8, 16] float32 output, as a .pt
    plain = tmp_path / "plain.pt"
    torch.save(torch.zeros(1 << 20), plain)  # 4 MiB of zeros
    bomb = rank_dir / "dump_tensor_data" / output["data_name"]
    with zipfile.ZipFile(plain) as src, zipfile.ZipFile(bomb, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert bomb.stat().st_size < 100_000  # what it weighs on disk
    line = _import_fails(dump_dir, tmp_path, capsys)
    assert "refused before inflating" in line and "tensor needs 512" in line  # 1*8*16 float32
    # the same archive is fine where its record says it holds that many numbers
    output["shape"] = [1 << 20]
    _save(rank_dir, dump)
    run = precguard.load_run(precguard.import_msprobe(dump_dir, tmp_path / "out"))
    [record] = [r for r in run.records() if r.key == "model.layers.1.mlp.0.forward.output.0"]
    assert run.tensor(record).shape == (1 << 20,)


def test_an_empty_dump_leaves_no_output_and_blames_the_input(tmp_path, capsys) -> None:
    dump_dir, rank_dir, dump = _copy("stats", tmp_path)
    dump["data"] = {}
    _save(rank_dir, dump)
    line = _import_fails(dump_dir, tmp_path, capsys)
    assert str(dump_dir) in line and "holds no records" in line


def test_many_sibling_calls_each_become_a_root(tmp_path, capsys) -> None:
    """Calls with no parent among them (the import once copied the list of them per call)."""
    dump_dir, rank_dir, dump = _copy("stats", tmp_path)
    entry = dump["data"][MLP_OUT]
    dump["data"] = {
        f"Module.model.layers.{i}.mlp.LlamaMLP.forward.0": json.loads(json.dumps(entry))
        for i in range(2000)
    }
    _save(rank_dir, dump)
    (rank_dir / "construct.json").unlink(missing_ok=True)
    code, _, err = run_cli(["import-msprobe", str(dump_dir), "--out", str(tmp_path / "o")], capsys)
    assert code == 0, err
    from precguard import Run

    modules = {r.module for r in Run(tmp_path / "o").records()}
    assert {f"model.layers.{i}.mlp" for i in range(2000)} <= modules
