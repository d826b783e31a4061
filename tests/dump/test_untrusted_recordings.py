"""A recording is untrusted input: a colleague's, a vendor's, a bug report's.

Whoever opens one must be safe: no code from it runs, nothing outside it is
read, nothing of the user's is lost, and every malformed file is refused with
one clear line (exit 2), never an internal error.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import sys
import tracemalloc
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError, safe_open

import precguard
from precguard import DumpFormatError
from precguard.text import shown

CANARY = "CANARY-5f2b9c"
MODULE = "model.layers.0.mlp"


def cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the precguard CLI in-process (warnings off); return (exit code, stdout, stderr)."""
    from precguard.cli import main

    capsys.readouterr()
    try:
        main(["--log-level", "error", *args])
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    out, err = capsys.readouterr()
    return code, out, err


def refused(code: int, err: str) -> str:
    """Assert a clean refusal (exit 2, one error line, no traceback); return that line."""
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("precguard: error: ") and "internal error" not in err
    assert len(lines[0]) < 800
    return lines[0]


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two identical tiny-llama recordings: 2 training steps, full tensors of layer 0."""
    base = tmp_path_factory.mktemp("untrusted")
    kw = {"steps": 2, "train": True, "tensors": ["model.layers.0.*"]}
    golden = precguard.record_target("tiny-llama", out=base / "golden", **kw)
    actual = precguard.record_target("tiny-llama", out=base / "actual", **kw)
    return golden, actual


@pytest.fixture
def mutant(pair: tuple[Path, Path], tmp_path: Path) -> Path:
    """A fresh copy of the actual recording to be tampered with."""
    return Path(shutil.copytree(pair[1], tmp_path / "mutant", symlinks=True))


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the recording, with a canary file a hostile recording points at."""
    folder = tmp_path / "outside"
    folder.mkdir()
    (folder / "secret.safetensors").write_text(CANARY * 50)
    return folder


def records_of(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "rank0" / "records.jsonl").read_text().splitlines()]


def write_records(run: Path, records: list[dict]) -> None:
    text = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
    (run / "rank0" / "records.jsonl").write_text(text)


def edit_manifest(run: Path, **fields: object) -> None:
    data = json.loads((run / "manifest.json").read_text())
    data.update(fields)
    (run / "manifest.json").write_text(json.dumps(data))


# -- no code from a recording runs ---------------------------------------------------------


def test_replay_never_runs_the_target_the_manifest_names(mutant: Path, tmp_path: Path, capsys):
    marker = tmp_path / "ran.txt"
    evil = tmp_path / "evil.py"
    evil.write_text(f"open({str(marker)!r}, 'w').write('x')\ndef target():\n    raise SystemExit\n")
    for spec in (f"{evil}:target", "os:abort", "sys:exit", "\x1b[2Jtiny-llama"):
        edit_manifest(mutant, target=spec)

        code, out, err = cli(["replay", str(mutant), "--module", MODULE], capsys)

        line = refused(code, err)
        assert "needs --target" in line and "never chooses the code" in line
        assert "\x1b" not in line  # the suggestion is shown escaped
        assert not marker.exists()
    # the user names the code: replay runs it
    code, out, err = cli(["replay", str(mutant), "-m", MODULE, "--target", "tiny-llama"], capsys)
    assert code == 0, err
    assert "MATCH" in out


# -- nothing outside the recording is read -------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["ABSOLUTE", "../../outside/secret.safetensors", "../rank0/../../outside/x", "t" * 300, ""],
)
def test_a_tensor_file_outside_the_recording_is_refused(
    pair, mutant: Path, outside: Path, name: str, capsys
):
    name = str(outside / "secret.safetensors") if name == "ABSOLUTE" else name
    records = records_of(mutant)
    victim = next(r for r in records if r.get("tensor"))
    victim["tensor"]["file"] = name
    write_records(mutant, records)

    code, out, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    line = refused(code, err)
    assert f"record {victim['key']}" in line
    assert CANARY not in out + err
    with pytest.raises(DumpFormatError, match="record"):
        precguard.load_run(mutant).tensor(precguard.dump.schema.Record.model_validate(victim))


@pytest.mark.parametrize("what", ["rank0", "rank0/records.jsonl", "manifest.json", "tensor"])
def test_a_symbolic_link_leading_out_of_the_recording_is_refused(
    pair, mutant: Path, outside: Path, what: str, capsys
):
    if what == "tensor":
        what = str(next((mutant / "rank0").glob("tensors-*")).relative_to(mutant))
    inside = mutant / what
    shutil.move(str(inside), str(outside / "moved"))
    inside.symlink_to(outside / "moved")

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    assert "leads outside the recording" in refused(code, err)


def test_a_link_that_stays_inside_the_recording_is_fine(pair, mutant: Path, capsys):
    tensor = next((mutant / "rank0").glob("tensors-*"))
    tensor.rename(mutant / "rank0" / "elsewhere.bin")
    tensor.symlink_to("elsewhere.bin")

    code, out, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    assert code == 0, err
    assert "MATCH" in out


@pytest.mark.parametrize("name", ["rank\u00b2", "rank00", "rank-1", "rank\uff11"])
def test_a_rank_folder_is_rank_and_ascii_digits(pair, mutant: Path, name: str, capsys):
    (mutant / "rank0").rename(mutant / name)

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    assert "no rank*/records.jsonl found" in refused(code, err)


# -- tensors are read as strictly as the safetensors library reads them ---------------------


def _rewrite_header(path: Path, change) -> None:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    change(header)
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + raw[8 + n :])


def _first_f32(header: dict) -> str:
    return next(k for k, v in header.items() if k != "__metadata__" and v["dtype"] == "F32")


HEADER_CORRUPTIONS = {
    "dtype F32 -> F64": lambda h: h[_first_f32(h)].update(dtype="F64"),
    "dtype F32 -> F16": lambda h: h[_first_f32(h)].update(dtype="F16"),
    "dtype F32 -> I8": lambda h: h[_first_f32(h)].update(dtype="I8"),
    "shape missing": lambda h: h[_first_f32(h)].pop("shape"),
    "shape negative": lambda h: h[_first_f32(h)].update(shape=[-1, 64]),
    "shape of strings": lambda h: h[_first_f32(h)].update(shape=["2", 64]),
    "shape huge": lambda h: h[_first_f32(h)].update(shape=[2**40, 2**40]),
    "offsets null": lambda h: h[_first_f32(h)].update(data_offsets=None),
    "offsets into the header": lambda h: h[_first_f32(h)].update(data_offsets=[-8, 8]),
    "offsets past the end": lambda h: h[_first_f32(h)].update(data_offsets=[0, 2**70]),
    "offsets of a neighbour": lambda h: h[_first_f32(h)].update(
        data_offsets=next(
            v["data_offsets"] for k, v in h.items() if k not in (_first_f32(h), "__metadata__")
        )
    ),
}


@pytest.mark.parametrize("corruption", sorted(HEADER_CORRUPTIONS))
def test_a_corrupt_safetensors_header_is_refused_like_the_library_does(
    pair, mutant: Path, corruption: str, capsys
):
    path = max((mutant / "rank0").glob("tensors-*"), key=lambda p: p.stat().st_size)
    _rewrite_header(path, HEADER_CORRUPTIONS[corruption])
    with pytest.raises(SafetensorError), safe_open(str(path), framework="pt") as fh:
        for name in fh.keys():  # noqa: SIM118 - the library's verdict on the same file
            fh.get_tensor(name)

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    line = refused(code, err)
    assert path.name in line and "safetensors" in line


def test_a_huge_header_length_is_refused_without_echoing_the_file(pair, mutant: Path, capsys):
    path = next((mutant / "rank0").glob("tensors-*"))
    path.write_bytes(b"root:x:0:0:root:/root:/bin/bash\n" + path.read_bytes())

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    line = refused(code, err)
    assert "3475222254926655346" not in line and "root:x" not in line


def test_a_tensor_of_another_dtype_or_shape_than_its_record_is_refused(pair, mutant: Path, capsys):
    records = records_of(mutant)
    victim = next(r for r in records if r.get("tensor") and r["role"] == "output")
    victim["shape"] = [*victim["shape"][:-1], victim["shape"][-1] * 2]
    write_records(mutant, records)

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    line = refused(code, err)
    assert victim["key"] in line and "the record says" in line


# -- strings from a recording are escaped ---------------------------------------------------


def test_terminal_escapes_and_markup_in_a_recording_are_printed_harmlessly(
    pair, mutant: Path, capsys
):
    data = json.loads((mutant / "manifest.json").read_text())
    data["device"] = "cpu\x1b[2J\x1b]0;owned\x07"
    data["fingerprint"]["[/]"] = "[bold]x"
    data["fingerprint"]["long"] = "y" * 1_000_000
    (mutant / "manifest.json").write_text(json.dumps(data))

    code, out, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    assert code == 0, err  # the numbers match; the strange strings are just shown
    assert "\x1b" not in out and "\x07" not in out
    assert "\\x1b[2J" in out and "[/]" in out
    assert len(out) < 20_000  # the megabyte value is cut


def test_shown_escapes_control_characters_markup_and_length():
    assert shown("a\x1b[31mb\nc\u202ed") == "a\\x1b[31mb\\nc\\u202ed"
    assert shown("[/]", markup=True) == "\\[/]"
    long = shown("x" * 10_000, 50)
    assert long.startswith("x" * 50) and long.endswith("(+9950 chars)")
    assert len(shown("\x00" * 1000, 50)) < 80


def test_an_error_never_echoes_a_huge_string(pair, mutant: Path, capsys):
    edit_manifest(mutant, model="M" * 1_000_000)

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    line = refused(code, err)
    assert "model" in line and "chars)" in line


# -- malformed files are refused cleanly ----------------------------------------------------


@pytest.mark.parametrize("version", ["2", 2.0, True, None, 0, 2, "1"])
def test_schema_version_must_be_an_integer_this_precguard_reads(
    pair, mutant: Path, version, capsys
):
    edit_manifest(mutant, schema_version=version)

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    assert "schema_version" in refused(code, err)


def test_deeply_nested_json_is_refused(pair, mutant: Path, capsys):
    deep = "[" * 100_000 + "]" * 100_000
    text = (mutant / "manifest.json").read_text().rstrip()
    (mutant / "manifest.json").write_text(text[:-1] + f', "deep": {deep}}}')

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    assert "manifest.json: not valid JSON" in refused(code, err)


def test_invalid_utf8_in_records_names_the_line(pair, mutant: Path, capsys):
    path = mutant / "rank0" / "records.jsonl"
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b'"key":"', b'"key":"\xff\xfe', 1)
    path.write_bytes(b"\n".join(lines))

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    assert "records.jsonl line 4: not valid UTF-8" in refused(code, err)


def test_a_record_of_another_rank_is_refused(pair, mutant: Path, capsys):
    records = records_of(mutant)
    records[5]["rank"] = 3
    write_records(mutant, records)

    code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

    assert "line 6: record of rank 3 in the rank 0 file" in refused(code, err)


def test_a_records_file_cut_at_a_line_is_reported_as_truncated(pair, mutant: Path, capsys):
    path = mutant / "rank0" / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    step_one = next(i for i, line in enumerate(lines) if json.loads(line)["step"] == 1)
    for keep in (40, step_one):  # within step 0 of 2, and at the end of step 0
        path.write_text("".join(lines[:keep]))

        code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)

        line = refused(code, err)
        assert "truncated" in line and "same model" not in line


# -- memory stays flat in the number of records ---------------------------------------------


def test_a_million_copies_of_one_record_are_refused_at_the_second(pair, mutant: Path, capsys):
    path = mutant / "rank0" / "records.jsonl"
    first = path.read_text().splitlines(keepends=True)[0]
    with open(path, "w") as fh:
        for _ in range(100):
            fh.write(first * 10_000)  # 1e6 lines, ~400 MB of one record

    tracemalloc.start()
    try:
        code, _, err = cli(["compare", str(pair[0]), str(mutant)], capsys)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        path.unlink()  # pytest keeps the last runs' temporary folders

    assert "line 2: seq 0 after 0: a duplicated or re-ordered record" in refused(code, err)
    assert peak < 50 * 2**20


def test_gradient_accumulation_recordings_stay_readable(tmp_path: Path):
    # a parameter's gradient is recorded once per backward under the same key:
    # the duplicate check is on seq (one line twice), not on keys
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    with precguard.monitor(model, tmp_path / "run", auto_step=False) as handle:
        for _micro_batch in range(2):
            model(torch.randn(2, 4)).sum().backward()
        handle.step()

    records = list(precguard.load_run(tmp_path / "run").records())

    grads = [r.key for r in records if r.role == "grad"]
    assert len(grads) == 2 * len(set(grads)) > 0


def _synthetic_run(path: Path, n: int) -> Path:
    """A recording of ``n`` statistics-only records, 100 per step."""
    from precguard.dump.writer import RunWriter

    writer = RunWriter(path, model="Synthetic")
    stats = dict.fromkeys(("min", "max", "mean", "std", "absmax", "l2"), 1.0)
    stats |= {"nan": 0, "inf": 0, "zeros": 0, "numel": 4}
    for start in range(0, n, 1000):
        writer.write_records(
            [
                {
                    "key": f"m{i % 100}.0.forward.output.0", "module": f"m{i % 100}",
                    "module_type": "Linear", "call": 0, "phase": "forward", "role": "output",
                    "index": 0, "step": i // 100, "rank": 0, "seq": i, "dtype": "float32",
                    "shape": [4], "stats": dict(stats),
                }
                for i in range(start, min(n, start + 1000))
            ]
        )  # fmt: skip
    writer.close(steps=n // 100)
    return path


def test_reading_records_takes_memory_flat_in_their_number(tmp_path: Path):
    peaks = []
    for n in (10_000, 40_000):
        run = precguard.load_run(_synthetic_run(tmp_path / f"r{n}", n))
        tracemalloc.start()
        try:
            count = sum(1 for _ in run.records())
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert count == n
        peaks.append(peak)
    assert peaks[1] < 2 * peaks[0] + 2**20, peaks  # 4x the records, not 4x the memory


# -- nothing of the user's is lost ----------------------------------------------------------


def test_overwrite_refuses_a_directory_that_is_not_a_recording(tmp_path: Path, capsys):
    out = tmp_path / "project"
    (out / "ranking_notes").mkdir(parents=True)
    (out / "ranking_notes" / "n.txt").write_text("notes")
    (out / "rank_list.csv").write_text("a,b\n")
    before = sorted(str(p.relative_to(out)) for p in out.rglob("*"))

    code, _, err = cli(["record", "-t", "tiny-llama", "--out", str(out), "--overwrite"], capsys)

    assert "not a precguard recording" in refused(code, err)
    assert sorted(str(p.relative_to(out)) for p in out.rglob("*")) == before


def test_overwrite_never_follows_a_symlinked_rank_folder(pair, tmp_path: Path, capsys):
    out = Path(shutil.copytree(pair[1], tmp_path / "run"))
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "data.bin").write_text("keep me")
    shutil.rmtree(out / "rank0")
    (out / "rank0").symlink_to(precious)

    code, _, err = cli(["record", "-t", "tiny-llama", "--out", str(out), "--overwrite"], capsys)

    assert "symbolic link" in refused(code, err)
    assert (precious / "data.bin").read_text() == "keep me"
    assert (out / "manifest.json").is_file()


def test_overwrite_replaces_a_recording_and_keeps_the_users_other_files(
    pair, tmp_path: Path, capsys
):
    out = Path(shutil.copytree(pair[1], tmp_path / "run"))
    (out / "README.txt").write_text("what this run is")
    (out / "rank_list.csv").write_text("a,b\n")

    code, _, err = cli(["record", "-t", "tiny-llama", "--out", str(out), "--overwrite"], capsys)

    assert code == 0, err
    assert (out / "README.txt").read_text() == "what this run is"
    assert (out / "rank_list.csv").read_text() == "a,b\n"
    assert precguard.load_run(out).manifest.steps == 1  # the new recording


def test_overwrite_never_writes_through_a_planted_link(pair, tmp_path: Path, capsys):
    out = Path(shutil.copytree(pair[1], tmp_path / "run"))
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    for name in (".precguard-write-test", "manifest.json.tmp"):
        (out / name).symlink_to(victim)

    code, _, err = cli(["record", "-t", "tiny-llama", "--out", str(out), "--overwrite"], capsys)

    assert code == 0, err
    assert victim.read_text() == "keep me"


def test_watch_only_save_writes_nothing(tmp_path: Path, monkeypatch, caplog):
    monkeypatch.chdir(tmp_path)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 4))
    with torch.no_grad():
        model[1].weight[0, 0] = float("nan")

    with (
        caplog.at_level("WARNING", logger="precguard"),
        precguard.monitor(model, None, on_nonfinite="save"),
        torch.no_grad(),
    ):
        out = model(torch.ones(1, 4))

    assert torch.isnan(out).any()
    assert list(tmp_path.iterdir()) == []
    assert any("nonfinite_inputs_not_saved" in r.getMessage() for r in caplog.records)


# -- the user's own path may be anything ----------------------------------------------------


@pytest.mark.skipif(sys.platform != "linux", reason="symbolic links of the test")
def test_the_recording_itself_may_be_reached_through_a_link(pair, tmp_path: Path, capsys):
    link = tmp_path / "link"
    link.symlink_to(os.path.abspath(pair[1]))

    code, out, err = cli(["compare", str(pair[0]), str(link)], capsys)

    assert code == 0, err
    assert "MATCH" in out


def test_the_path_resolver_keeps_every_name_inside(tmp_path: Path):
    from precguard.dump.paths import rank_of, resolve_member

    root = tmp_path / "run"
    (root / "rank0").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "rank0" / "out").symlink_to(tmp_path / "elsewhere")
    (root / "rank0" / "in").symlink_to(root / "rank0")

    assert resolve_member(root, "rank0/t.safetensors", what="x") == (
        root.resolve() / "rank0" / "t.safetensors"
    )
    assert (
        resolve_member(root, "rank0/in/t.safetensors", what="x").parent == root.resolve() / "rank0"
    )
    for bad in ("/etc/passwd", "../x", "rank0/../../x", "rank0//x", "a\x00b", "x" * 256, ""):
        with pytest.raises(DumpFormatError):
            resolve_member(root, bad, what="x")
    with pytest.raises(DumpFormatError, match="leads outside"):
        resolve_member(root, "rank0/out/t.safetensors", what="x")
    assert [rank_of(n) for n in ("rank0", "rank12", "rank01", "rank\u00b2", "rank", "rank1x")] == [
        0,
        12,
        None,
        None,
        None,
        None,
    ]


def test_shown_is_printable_and_bounded_for_any_string():
    import random

    rng = random.Random(14)
    alphabet = [chr(c) for c in (*range(0, 0x250), 0x202E, 0x2028, 0xFEFF, 0x1F600, 0xDC80)]
    for _ in range(500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 400)))
        for markup in (False, True):
            out = shown(text, 100, markup=markup)
            assert out.isprintable(), repr(out)
            assert len(out) <= 2 * 100 + 20  # markup escaping at most doubles it


@pytest.mark.slow
def test_the_real_cli_refuses_a_recording_that_names_os_abort(mutant: Path):
    import subprocess

    edit_manifest(mutant, target="os:abort", device="cpu\x1b[2J")
    proc = subprocess.run(
        [sys.executable, "-m", "precguard", "replay", str(mutant), "-m", MODULE],
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 2, proc.stderr  # not SIGABRT (-6), not a silent 0
    assert proc.stderr.count("\n") == 1 and "pass --target os:abort" in proc.stderr
    assert "\x1b" not in proc.stdout + proc.stderr


def test_a_hash_that_is_not_16_hex_digits_is_refused(pair: tuple[Path, Path], mutant: Path, capsys):
    # compare --bitwise prints hashes: free text there would reach the terminal
    records = records_of(mutant)
    records[0]["hash"] = "\x1b[2J" + "f" * 5000
    write_records(mutant, records)

    code, _, err = cli(["compare", str(pair[0]), str(mutant), "--bitwise"], capsys)

    line = refused(code, err)
    assert "hash" in line and "\x1b" not in line
