"""Fuzz precguard with hostile recordings: seeded mutations of a real small recording.

Records tiny-llama twice (training, two steps, full tensors of layer 0 and the
LM head), then applies one seeded mutation at a time to a fresh copy of the
second recording (the manifest, records lines, safetensors headers and bytes,
file names, symbolic links leading out of the recording) and runs ``precguard
compare GOLDEN MUTANT`` in-process (every fifth mutant as the golden
instead), reads the mutant through ``load_run`` (every record, every tensor)
and, for some, ``precguard replay``. It prints
the tally:

* ``mutations``: recordings tried;
* ``clean refusals``: exit 2 with one ``precguard: error:`` line;
* ``accepted``: exit 0, 1 or 3 (a verdict, partial or not);
* ``internal errors``: an ``internal error`` line, a traceback, a crash, or a
  refusal of more than one line (a bug every time);
* ``inconsistent accepted``: exit 0/1/3 for a recording that an independent
  checker (stdlib ``json`` and the safetensors library) finds inconsistent, or
  for a mutation made to be refused (a bug every time);
* ``leaks``: output that quotes the canary file outside the recording, or a
  raw escape character on the terminal;
* peak memory (VmHWM) of the process.

    .venv/bin/python benchmarks/fuzz_recordings.py [--mutations 1000] [--seed 0]

The suite runs the same engine for about a minute (tests/dump/test_fuzz.py).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import random
import shutil
import struct
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

#: what a mutation must lead to: "refuse" (exit 2), "accept" (exit 0/1) or "either"
Expect = str
CANARY = "CANARY-d41d8cd98f00b204"


@dataclass
class Outcome:
    """What one mutation did."""

    mutation: str
    expect: Expect
    code: int
    stderr: str
    problems: list[str] = field(default_factory=list)


# -- the base recordings -------------------------------------------------------------------


def build_base(root: Path) -> tuple[Path, Path]:
    """Record golden and actual (identical runs) of tiny-llama under ``root``."""
    import precguard

    kw = {"steps": 2, "train": True, "tensors": ["model.layers.0.*", "lm_head"]}
    golden = precguard.record_target("tiny-llama", out=root / "golden", **kw)
    actual = precguard.record_target("tiny-llama", out=root / "actual", **kw)
    return golden, actual


# -- mutations -------------------------------------------------------------------------------

#: a mutation changes the recording in place; returns what must follow (and a detail)
Mutation = Callable[[random.Random, Path, Path], "Expect | tuple[Expect, str]"]


def _lines(run: Path) -> list[str]:
    return (run / "rank0" / "records.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)


def _write_lines(run: Path, lines: list[str]) -> None:
    (run / "rank0" / "records.jsonl").write_text("".join(lines), encoding="utf-8")


def _tensor_files(run: Path) -> list[Path]:
    return sorted((run / "rank0").glob("tensors-*.safetensors"))


def _manifest(run: Path) -> dict:
    return json.loads((run / "manifest.json").read_text())


def _set_manifest(run: Path, data: dict) -> None:
    (run / "manifest.json").write_text(json.dumps(data))


def m_schema_version(rng: random.Random, run: Path, _out: Path) -> Expect:
    value = rng.choice(["2", 2.0, True, 2, 0, -1, None, "1", 1.0, [1], 1])
    data = _manifest(run)
    data["schema_version"] = value
    _set_manifest(run, data)
    return "accept" if type(value) is int and value == 1 else "refuse"


def m_manifest_strings(rng: random.Random, run: Path, _out: Path) -> Expect:
    hostile = rng.choice(
        ["\x1b[2J\x1b[31mPWNED", "[/]", "[bold]x[/bold][link=http://x]y", "\u202egpu", "\n\r\t"]
    )
    data = _manifest(run)
    where = rng.choice(["device", "model_key", "fingerprint_value", "dtype", "target"])
    if where == "device":
        data["device"] = hostile
    elif where == "model_key":
        data["fingerprint"][hostile] = "x"
    elif where == "fingerprint_value":
        data["fingerprint"]["torch"] = hostile * rng.choice([1, 10_000])
    elif where == "dtype":
        data["dtype"] = hostile
    else:
        data["target"] = "os:abort"
    _set_manifest(run, data)
    return "accept"


def m_manifest_fields(rng: random.Random, run: Path, _out: Path) -> Expect:
    data = _manifest(run)
    field_name = rng.choice(["complete", "steps", "world_size", "device", "created", "options"])
    value = rng.choice(["yes", 1, -1, 10**30, None, "", [], {}, 2.5, "x" * 100_000])
    if value is None and rng.random() < 0.5:
        data.pop(field_name, None)
    else:
        data[field_name] = value
    _set_manifest(run, data)
    return "either", field_name


def m_deep_json(rng: random.Random, run: Path, _out: Path) -> Expect:
    depth = rng.choice([1000, 100_000])
    deep = "[" * depth + "]" * depth
    where = rng.choice(["manifest", "record", "header"])
    if where == "manifest":
        text = (run / "manifest.json").read_text()
        (run / "manifest.json").write_text(text.rstrip()[:-1] + f', "deep": {deep}}}')
    elif where == "record":
        lines = _lines(run)
        i = rng.randrange(len(lines))
        lines[i] = lines[i].rstrip()[:-1] + f', "deep": {deep}}}\n'
        _write_lines(run, lines)
    else:
        path = rng.choice(_tensor_files(run))
        _rewrite_header(path, lambda h: {**h, "__metadata__": {"x": "y"}}, extra=f'"d":{deep},')
    return "refuse" if depth > 1000 else "either"


def m_duplicate_line(rng: random.Random, run: Path, _out: Path) -> Expect:
    lines = _lines(run)
    i = rng.randrange(len(lines))
    copies = rng.choice([1, 2, 1000])
    lines[i + 1 : i + 1] = [lines[i]] * copies
    _write_lines(run, lines)
    return "refuse"


def m_swap_lines(rng: random.Random, run: Path, _out: Path) -> Expect:
    lines = _lines(run)
    i = rng.randrange(len(lines) - 1)
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    _write_lines(run, lines)
    return "refuse"


def m_delete_line(rng: random.Random, run: Path, _out: Path) -> Expect:
    lines = _lines(run)
    del lines[rng.randrange(len(lines))]
    _write_lines(run, lines)
    return "either"  # a missing record (or, the last ones, a cut file)


def m_cut_records(rng: random.Random, run: Path, _out: Path) -> Expect:
    text = (run / "rank0" / "records.jsonl").read_bytes()
    at = rng.randrange(len(text))
    (run / "rank0" / "records.jsonl").write_bytes(text[:at])
    return "either"


def m_record_field(rng: random.Random, run: Path, _out: Path) -> Expect:
    lines = _lines(run)
    with_tensor = [i for i, line in enumerate(lines) if '"tensor":{' in line]
    i = rng.choice(with_tensor) if rng.random() < 0.6 else rng.randrange(len(lines))
    rec = json.loads(lines[i])
    has_tensor = rec.get("tensor") is not None
    choice = rng.choice(
        [
            "seq_str", "shape_neg", "shape_other", "dtype_other", "rank", "file_abs",
            "file_up", "file_long", "file_nul", "name_other", "stats_mean", "stats_bad",
            "key_huge", "step_back", "shape_huge", "dtype_unknown", "name_args",
        ]
    )  # fmt: skip
    expect: Expect = "refuse"
    if choice == "seq_str":
        rec["seq"] = "x"
    elif choice == "shape_neg":
        rec["shape"] = [-1, *rec["shape"][1:]]
    elif choice == "shape_other":
        rec["shape"] = [*rec["shape"], 2]
        expect = "refuse" if has_tensor else "either"
    elif choice == "shape_huge":
        rec["shape"] = [2**62, 2**62]
        expect = "refuse" if has_tensor else "either"
    elif choice == "dtype_other":
        rec["dtype"] = "float16" if rec["dtype"] != "float16" else "float32"
        expect = "refuse" if has_tensor else "either"
    elif choice == "dtype_unknown":
        rec["dtype"] = "complex1024"
        expect = "refuse" if has_tensor else "either"
    elif choice == "rank":
        rec["rank"] = 1
    elif choice in ("file_abs", "file_up", "file_long", "file_nul"):
        if not has_tensor:
            return "accept"  # nothing changed
        rec["tensor"]["file"] = {
            "file_abs": str(_out / "outside.safetensors"),
            "file_up": "../../outside/outside.safetensors",
            "file_long": "t" * 300 + ".safetensors",
            "file_nul": "tensors\x00.safetensors",
        }[choice]
    elif choice == "name_other":
        if not has_tensor:
            return "accept"
        rec["tensor"]["name"] = "no-such-tensor"
    elif choice == "stats_mean":
        if rec.get("stats") is None:
            return "accept"
        rec["stats"]["mean"] = 123.0
        expect = "accept"
    elif choice == "stats_bad":
        rec["stats"] = {"mean": "lots"}
    elif choice == "key_huge":
        rec["key"] = "k" * 1_000_000
        expect = "either"
    elif choice == "step_back":
        if rec["step"] == 0:
            return "accept"
        rec["step"] = 0
        expect = "either"  # step 0's records then step 1 again: refused unless it is the last
    elif choice == "name_args":
        rec["name"] = rng.choice(["args.x", "args.99999999", "args.0.1.2", "kwargs", "other.0"])
        expect = "either"
    lines[i] = json.dumps(rec, separators=(",", ":")) + "\n"
    _write_lines(run, lines)
    return expect, choice


def m_invalid_utf8(rng: random.Random, run: Path, _out: Path) -> Expect:
    path = run / "rank0" / "records.jsonl"
    data = bytearray(path.read_bytes())
    lines_at = [i for i, b in enumerate(data) if b == ord('"')]
    at = rng.choice(lines_at)
    data[at + 1 : at + 1] = b"\xff\xfe"
    path.write_bytes(bytes(data))
    return "refuse"


def m_flip_bytes(rng: random.Random, run: Path, _out: Path) -> Expect:
    path = rng.choice([run / "manifest.json", run / "rank0" / "records.jsonl"])
    data = bytearray(path.read_bytes())
    for _ in range(rng.choice([1, 3, 10])):
        data[rng.randrange(len(data))] = rng.randrange(256)
    path.write_bytes(bytes(data))
    return "either"


def _read_header(path: Path) -> tuple[dict, bytes]:
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + n]), raw[8 + n :]


def _rewrite_header(path: Path, change: Callable[[dict], dict], extra: str = "") -> None:
    header, data = _read_header(path)
    text = json.dumps(change(header), separators=(",", ":"))
    if extra:
        text = "{" + extra + text[1:]
    blob = text.encode()
    blob += b" " * (-len(blob) % 8)
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def m_safetensors_header(rng: random.Random, run: Path, _out: Path) -> Expect:
    path = rng.choice(_tensor_files(run))
    header, _ = _read_header(path)
    names = [k for k in header if k != "__metadata__"]
    name = rng.choice(names)
    choice = rng.choice(
        [
            "dtype", "shape_missing", "shape_neg", "shape_short", "shape_str", "shape_huge",
            "offsets_null", "offsets_odd", "offsets_header", "offsets_neighbour", "offsets_neg",
            "offsets_big", "not_object",
        ]
    )  # fmt: skip

    def change(h: dict) -> dict:
        i = h[name]
        start, end = i["data_offsets"]
        if choice == "dtype":
            codes = ["F64", "F32", "F16", "I8", "BF16", "I64", "X9"]
            i["dtype"] = rng.choice([c for c in codes if c != i["dtype"]])
        elif choice == "shape_missing":
            del i["shape"]
        elif choice == "shape_neg":
            i["shape"] = [-1, *i["shape"][1:]]
        elif choice == "shape_short":
            i["shape"] = i["shape"][:-1]
        elif choice == "shape_str":
            i["shape"] = ["2", *i["shape"][1:]]
        elif choice == "shape_huge":
            i["shape"] = [2**40, 2**40]
        elif choice == "offsets_null":
            i["data_offsets"] = None
        elif choice == "offsets_odd":
            i["data_offsets"] = [start + 1, end + 1]
        elif choice == "offsets_header":
            i["data_offsets"] = [-8, end - start - 8]
        elif choice == "offsets_neighbour":
            other = [k for k in h if k not in (name, "__metadata__")]
            if other:
                i["data_offsets"] = h[rng.choice(other)]["data_offsets"]
            else:
                i["data_offsets"] = [0, 0]
        elif choice == "offsets_neg":
            i["data_offsets"] = [-1, end]
        elif choice == "offsets_big":
            i["data_offsets"] = [start, 2**70]
        elif choice == "not_object":
            h[name] = [1, 2]
        return h

    _rewrite_header(path, change)
    return "refuse", choice


def m_safetensors_bytes(rng: random.Random, run: Path, _out: Path) -> Expect:
    path = rng.choice(_tensor_files(run))
    raw = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", raw[:8])
    choice = rng.choice(["data", "data", "header_byte", "length", "truncate"])
    if choice == "data":
        for _ in range(rng.choice([1, 8, 64])):
            raw[rng.randrange(8 + n, len(raw))] = rng.randrange(256)
        path.write_bytes(bytes(raw))
        return "accept"  # other numbers (maybe NaN): a verdict, not a refusal
    if choice == "header_byte":
        raw[rng.randrange(8, 8 + n)] = rng.randrange(256)
        path.write_bytes(bytes(raw))
        return "either"
    if choice == "length":
        value = rng.choice([0, 7, n + 1, 2**63, 3475222254926655346])
        path.write_bytes(struct.pack("<Q", value) + bytes(raw[8:]))
        return "refuse"
    path.write_bytes(bytes(raw[: rng.randrange(len(raw))]))
    return "refuse"


def m_links(rng: random.Random, run: Path, outside: Path) -> Expect:
    choice = rng.choice(["rank_dir", "records", "manifest", "tensor", "inside_ok"])
    if choice == "rank_dir":
        shutil.copytree(run / "rank0", outside / "rank0-copy", dirs_exist_ok=True)
        shutil.rmtree(run / "rank0")
        (run / "rank0").symlink_to(outside / "rank0-copy")
    elif choice == "records":
        shutil.copy(run / "rank0" / "records.jsonl", outside / "records.jsonl")
        (run / "rank0" / "records.jsonl").unlink()
        (run / "rank0" / "records.jsonl").symlink_to(outside / "records.jsonl")
    elif choice == "manifest":
        shutil.copy(run / "manifest.json", outside / "manifest.json")
        (run / "manifest.json").unlink()
        (run / "manifest.json").symlink_to(outside / "manifest.json")
    elif choice == "tensor":
        target = rng.choice(_tensor_files(run))
        shutil.copy(target, outside / target.name)
        target.unlink()
        target.symlink_to(outside / target.name)
    else:
        target = rng.choice(_tensor_files(run))
        target.rename(run / "rank0" / "moved.bin")
        target.symlink_to("moved.bin")  # a link that stays inside: fine
        return "accept"
    return "refuse"


def m_names(rng: random.Random, run: Path, _out: Path) -> Expect:
    choice = rng.choice(["rank_super", "rank_zero", "long_file", "rank_file"])
    if choice == "rank_super":
        (run / "rank0").rename(run / "rank\u00b2")
        return "refuse"  # no rank folder left: an empty recording
    if choice == "rank_zero":
        (run / "rank0").rename(run / "rank00")
        return "refuse"
    if choice == "long_file":
        (run / "rank0" / ("x" * 250)).write_text("junk")
        return "accept"
    (run / "rank1").write_text("not a folder")
    return "accept"


def m_outside_pointer(rng: random.Random, run: Path, outside: Path) -> Expect:
    """Point every tensor at the canary file outside, by a relative climb."""
    lines = _lines(run)
    rel = os.path.relpath(outside / "outside.safetensors", run / "rank0")
    out = []
    for line in lines:
        rec = json.loads(line)
        if rec.get("tensor"):
            rec["tensor"]["file"] = rel
        out.append(json.dumps(rec, separators=(",", ":")) + "\n")
    _write_lines(run, out)
    return "refuse"


MUTATIONS: list[tuple[str, Mutation, int]] = [
    ("schema_version", m_schema_version, 2),
    ("manifest_strings", m_manifest_strings, 2),
    ("manifest_fields", m_manifest_fields, 1),
    ("deep_json", m_deep_json, 1),
    ("duplicate_line", m_duplicate_line, 2),
    ("swap_lines", m_swap_lines, 1),
    ("delete_line", m_delete_line, 1),
    ("cut_records", m_cut_records, 1),
    ("record_field", m_record_field, 6),
    ("invalid_utf8", m_invalid_utf8, 1),
    ("flip_bytes", m_flip_bytes, 2),
    ("safetensors_header", m_safetensors_header, 5),
    ("safetensors_bytes", m_safetensors_bytes, 3),
    ("links", m_links, 2),
    ("names", m_names, 1),
    ("outside_pointer", m_outside_pointer, 1),
]


# -- the independent consistency checker ----------------------------------------------------


def consistent(run: Path) -> bool:
    """True when ``run`` holds together, judged without precguard's reader.

    stdlib json for every file, the safetensors library for every tensor,
    file names that are plain names of regular files inside the run.
    """
    from pydantic import ValidationError
    from safetensors import safe_open

    from precguard.dump.schema import Manifest, Record

    root = os.path.realpath(run)

    def inside(p: Path) -> bool:
        real = os.path.realpath(p)
        return real.startswith(root + os.sep) or real == root

    try:
        if not inside(run / "manifest.json"):
            return False
        manifest = json.loads((run / "manifest.json").read_bytes())
        if type(manifest.get("schema_version")) is not int or manifest["schema_version"] != 1:
            return False
        mf = Manifest.model_validate(manifest)
        rank_dir = run / "rank0"
        if not rank_dir.is_dir() or not inside(rank_dir) or not inside(rank_dir / "records.jsonl"):
            return False
        raw = (rank_dir / "records.jsonl").read_bytes()
        last_seq, last_step = -1, -1
        body = raw.split(b"\n")
        if body and body[-1] != b"":
            body = body[:-1]  # a cut last line is skipped by design
        for line in body:
            if not line.strip():
                continue
            rec = Record.model_validate(json.loads(line.decode("utf-8")))
            if rec.rank != 0 or rec.seq <= last_seq or rec.step < last_step:
                return False
            if any(s < 0 for s in rec.shape):
                return False
            last_seq, last_step = rec.seq, rec.step
            if rec.tensor is not None:
                name = rec.tensor.file
                path = rank_dir / name
                if "/" in name or name in (".", "..") or not inside(path) or not path.is_file():
                    return False
                with safe_open(str(path), framework="pt") as fh:
                    if rec.tensor.name not in fh.keys():  # noqa: SIM118
                        return False
                    t = fh.get_tensor(rec.tensor.name)
                if str(t.dtype).removeprefix("torch.") != rec.dtype or list(t.shape) != rec.shape:
                    return False
        if mf.complete and mf.steps and last_step + 1 < mf.steps:
            return False
    except (ValueError, ValidationError, OSError, RecursionError, Exception):
        return False
    return True


# -- running precguard ------------------------------------------------------------------------


def run_cli(args: list[str]) -> tuple[int, str, str]:
    """Run the precguard CLI in this process; return (exit code, stdout, stderr)."""
    from precguard.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["--log-level", "error", *args])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return code, out.getvalue(), err.getvalue()


def _check_output(code: int, out: str, err: str, problems: list[str], what: str) -> None:
    if "internal error" in err or "Traceback" in err:
        problems.append(f"{what}: internal error: {err.strip()[-300:]}")
    if code == 2:
        lines = [line for line in err.splitlines() if line.strip()]
        if len(lines) != 1 or not lines[0].startswith("precguard: error: "):
            problems.append(f"{what}: refusal is not one error line: {err[:300]!r}")
        elif len(lines[0]) > 800:
            problems.append(f"{what}: error line of {len(lines[0])} characters")
    elif code not in (0, 1, 3):  # 3: a partial match (what was not compared is listed)
        problems.append(f"{what}: exit code {code}")
    if CANARY in out or CANARY in err:
        problems.append(f"{what}: leaked the canary file outside the recording")
    if "\x1b" in out or "\x1b" in err:
        problems.append(f"{what}: a raw escape character reached the terminal")


def _load_everything(path: Path, problems: list[str]) -> None:
    import precguard
    from precguard.errors import PrecguardError

    try:
        run = precguard.load_run(path)
        for rec in run.records():
            if rec.tensor is not None:
                run.tensor(rec)
    except PrecguardError:
        pass
    except Exception as exc:  # anything else escaping is what is looked for
        problems.append(f"load_run: {type(exc).__name__}: {str(exc)[:200]}")


def try_mutation(
    index: int,
    rng: random.Random,
    golden: Path,
    base: Path,
    work: Path,
    outside: Path,
    *,
    replay: bool,
) -> Outcome:
    """Apply one seeded mutation to a fresh copy of ``base`` and run precguard on it."""
    names, funcs, weights = zip(*MUTATIONS, strict=True)
    pick = rng.choices(range(len(funcs)), weights=weights)[0]
    mutant = work / f"m{index}"
    shutil.copytree(base, mutant, symlinks=True)
    answer = funcs[pick](rng, mutant, outside)
    expect, detail = answer if isinstance(answer, tuple) else (answer, "")
    name = f"{names[pick]}:{detail}" if detail else names[pick]
    # most mutants stand as the run under test, some as the golden (against the real
    # golden as actual: a mutant against its own base would be refused as a copy of it)
    pair = [str(mutant), str(golden)] if index % 5 == 4 else [str(golden), str(mutant)]
    code, out, err = run_cli(["compare", *pair])
    outcome = Outcome(name, expect, code, err)
    _check_output(code, out, err, outcome.problems, "compare")
    _load_everything(mutant, outcome.problems)
    if code in (0, 1, 3) and (expect == "refuse" or not consistent(mutant)):
        outcome.problems.append(f"inconsistent accepted: {name} (exit {code})")
    elif code == 2 and expect == "accept":
        outcome.problems.append(f"consistent refused: {name}: {err.strip()[:200]}")
    if replay:
        rc, rout, rerr = run_cli(
            ["replay", str(mutant), "-m", "model.layers.0.mlp", "--target", "tiny-llama"]
        )
        _check_output(rc, rout, rerr, outcome.problems, "replay")
        rc, rout, rerr = run_cli(["replay", str(mutant), "-m", "model.layers.0.mlp"])
        if rc != 2:
            outcome.problems.append("replay without --target did not refuse")
        _check_output(rc, rout, rerr, outcome.problems, "replay without target")
    shutil.rmtree(mutant, ignore_errors=True)
    return outcome


def peak_rss_mib() -> float:
    """This process's peak resident memory (VmHWM) in MiB."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return math.nan


def fuzz(
    root: Path,
    *,
    mutations: int,
    seed: int,
    seconds: float | None = None,
    replay_every: int = 0,
) -> tuple[Counter[str], list[Outcome]]:
    """Run up to ``mutations`` mutations (or until ``seconds`` pass); return tally and outcomes."""
    golden, base = build_base(root / "base")
    outside = root / "outside"
    outside.mkdir()
    (outside / "outside.safetensors").write_text(CANARY * 100)
    (outside / "secret.txt").write_text(CANARY)
    work = root / "work"
    work.mkdir()
    rng = random.Random(seed)
    tally: Counter[str] = Counter()
    outcomes: list[Outcome] = []
    start = time.monotonic()
    for i in range(mutations):
        if seconds is not None and time.monotonic() - start > seconds:
            break
        replay = bool(replay_every) and i % replay_every == 0
        o = try_mutation(i, rng, golden, base, work, outside, replay=replay)
        outcomes.append(o)
        tally["mutations"] += 1
        tally["clean refusals" if o.code == 2 else "accepted"] += 1
        tally["internal errors"] += any("internal" in p or "not one" in p for p in o.problems)
        tally["inconsistent accepted"] += any(p.startswith("inconsistent") for p in o.problems)
        tally["consistent refused"] += any(p.startswith("consistent refused") for p in o.problems)
        tally["leaks"] += any("leaked" in p or "escape" in p for p in o.problems)
        tally["other problems"] += bool(o.problems)
    return tally, outcomes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mutations", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replay-every", type=int, default=10, help="also replay every Nth")
    parser.add_argument("--dir", type=Path, default=None, help="where to work (default: tmp)")
    args = parser.parse_args()
    root = Path(tempfile.mkdtemp(prefix="precguard-fuzz-", dir=args.dir))
    try:
        t0 = time.perf_counter()
        tally, outcomes = fuzz(
            root, mutations=args.mutations, seed=args.seed, replay_every=args.replay_every
        )
        elapsed = time.perf_counter() - t0
        kinds = Counter(o.mutation.split(":")[0] for o in outcomes)
        print(f"seed {args.seed}: {tally['mutations']} mutations in {elapsed:.0f} s")
        print("by kind: " + ", ".join(f"{k} {v}" for k, v in sorted(kinds.items())))
        for key in (
            "clean refusals",
            "accepted",
            "internal errors",
            "inconsistent accepted",
            "consistent refused",
            "leaks",
        ):
            print(f"{key}: {tally[key]}")
        print(f"peak memory (VmHWM): {peak_rss_mib():.0f} MiB")
        bad = [o for o in outcomes if o.problems]
        for o in bad[:20]:
            print(f"  {o.mutation} (expect {o.expect}, exit {o.code}): {o.problems[0][:300]}")
        sys.exit(1 if bad else 0)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
