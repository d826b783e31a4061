"""Untrusted files: saved generation runs, watch directories, graph files, layout specs.

A user runs ``precguard generate-diff GOLDEN ACTUAL`` on runs a colleague
mailed, ``precguard watch-report`` on a directory a cluster job left, ``graph
diff`` on another machine's export. Whatever those files hold, each command
ends with a result (exit 0/1/3) or one ``precguard: error:`` line and exit 2:
never a traceback, a hang, a gigabyte of memory, a file read from outside the
directory, or a raw control character on the terminal (issue 31).

The named probes are the failures issue 31 found; the seeded fuzz runs a
fixed number of mutations (no time budget) over each surface. The memory
cases run in a subprocess under an address-space limit, so a size guard that
failed would end in MemoryError there, not in this process.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.dump.test_fuzz import _engine
from tests.dump.test_fuzz_surfaces import _hostile_text, _hostile_value

TARGETS = Path(__file__).parent / "generation" / "targets.py"
SRC = Path(__file__).resolve().parents[1] / "src"
#: what must never reach the terminal raw: ESC, BEL, a bidi override, a zero-width space
CONTROLS = ("\x1b", "\x07", "\u202e", "\u200b")
GiB = 1 << 30


def cli(args: list[str]) -> tuple[int, str, str]:
    """The CLI in this process: (exit code, stdout, stderr)."""
    return _engine().run_cli(args)


def check_clean(code: int, out: str, err: str, what: str) -> None:
    """A result or one error line; no traceback, no raw control character."""
    problems: list[str] = []
    _engine()._check_output(code, out, err, problems, what)
    assert not problems, problems[0]
    for ch in CONTROLS:
        assert ch not in out and ch not in err, f"{what}: raw {ch!r} reached the terminal"


@pytest.fixture(scope="module")
def saved_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean saved run: the peaked tiny LLaMA decoding one prompt for 3 steps on cpu."""
    root = tmp_path_factory.mktemp("saved")
    prompts = root / "one.jsonl"
    prompts.write_text(json.dumps({"text": "The quick brown fox"}) + "\n", encoding="utf-8")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        code, _, err = cli(["generate-diff", "-t", f"{TARGETS}:peaked", "--device", "cpu",
                            "--save-run", str(root / "run"), "--prompts", str(prompts),
                            "-n", "3"])  # fmt: skip
    finally:
        torch.set_num_threads(before)
    assert code == 0, err
    return root / "run"


@pytest.fixture(scope="module")
def watch_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean watch directory: a seeded two-layer net trained 6 steps."""
    import precguard

    out = tmp_path_factory.mktemp("watch") / "w"
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    handle = precguard.watch(model, opt, out=out, every=3)
    for step in range(6):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        loss = nn.functional.mse_loss(model(x), torch.sin(x[:, :2]))
        loss.backward()
        opt.step()
        opt.zero_grad()
        handle.step(loss)
    handle.close()
    return out


def _copy(src: Path, dest: Path) -> Path:
    return shutil.copytree(src, dest, symlinks=True)


def _meta(run: Path, change: Callable[[dict], object]) -> None:
    meta = json.loads((run / "generation.json").read_text(encoding="utf-8"))
    change(meta)
    (run / "generation.json").write_text(json.dumps(meta), encoding="utf-8")


def _retensor(run: Path, extra: dict[str, torch.Tensor] | None = None, steps: int | None = None):
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(run / "prompt-0.safetensors"))
    if steps is not None:
        tensors = {k: (v[:steps] if "scores" in k else v) for k, v in tensors.items()}
    tensors.update(extra or {})
    save_file(tensors, str(run / "prompt-0.safetensors"))


def _grow(path: Path, by: int) -> None:
    """Make ``path`` ``by`` bytes longer without writing them (a sparse tail of zeros)."""
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size + by)


def _deep(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


# -- saved generation runs: the failures issue 31 found ------------------------------------


def _link_outside(run: Path) -> None:
    outside = run.parent / f"{run.name}-outside"
    outside.mkdir()
    shutil.move(run / "prompt-0.safetensors", outside / "prompt-0.safetensors")
    (run / "prompt-0.safetensors").symlink_to(outside / "prompt-0.safetensors")


SAVED_PROBES: dict[str, tuple[Callable[[Path], object], str]] = {
    "100k-deep generation.json": (
        lambda r: (r / "generation.json").write_text(_deep()), "not valid JSON"),
    "a tensor named cache/x": (
        lambda r: _retensor(r, {"cache/x": torch.zeros(2)}), "cache/SNAPSHOT/NAME"),
    "a prompt token id of 10**30": (
        lambda r: _meta(r, lambda m: m["prompts"][0]["ids"].__setitem__(0, 10**30)),
        "prompts.0.ids.0"),
    "a seed of 10**30": (lambda r: _meta(r, lambda m: m.update(sample=True, seed=10**30)),
                         "field 'seed'"),
    "sampling at temperature 0": (
        lambda r: _meta(r, lambda m: m.update(sample=True, temperature=0.0)), "temperature"),
    "a prompt file that is a link leading outside": (_link_outside, "leads outside"),
    "a dict where the wall time is": (
        lambda r: _meta(r, lambda m: m["prompts"][0].update(seconds={"a": 1})), "seconds"),
    "a string where a count is": (lambda r: _meta(r, lambda m: m.update(layers="4")), "layers"),
    "an unknown compute dtype": (
        lambda r: _meta(r, lambda m: m["side"].update(compute_dtype="float7")), "compute_dtype"),
    "a prompt file padded past its tensors": (
        lambda r: _grow(r / "prompt-0.safetensors", 4096), "truncated or"),
}  # fmt: skip


@pytest.mark.parametrize("probe", list(SAVED_PROBES))
def test_a_hostile_saved_run_is_refused_in_one_line(
    saved_run: Path, tmp_path: Path, probe: str
) -> None:
    mutate, said = SAVED_PROBES[probe]
    run = _copy(saved_run, tmp_path / "run")
    mutate(run)
    code, out, err = cli(["generate-diff", str(saved_run), str(run)])
    check_clean(code, out, err, probe)
    assert code == 2 and said in err, (probe, err)


def _zero_steps(meta: dict) -> None:
    meta["steps"] = 0
    for p in meta["prompts"]:
        p.update(chosen=[], fed=[])


def test_saved_runs_of_zero_steps_are_inconclusive_not_a_match(
    saved_run: Path, tmp_path: Path
) -> None:
    runs = []
    for name in ("g", "a"):
        run = _copy(saved_run, tmp_path / name)
        _retensor(run, steps=0)
        _meta(run, _zero_steps)
        runs.append(str(run))
    code, out, err = cli(["generate-diff", *runs, "--json", str(tmp_path / "r.json")])
    check_clean(code, out, err, "zero steps")
    assert code == 3 and "INCONCLUSIVE" in out and "MATCH" not in out.replace("INCONCLUSIVE", "")
    assert json.loads((tmp_path / "r.json").read_text())["verdict"] == "inconclusive"


def test_control_characters_in_a_saved_run_are_escaped_on_the_terminal(
    saved_run: Path, tmp_path: Path
) -> None:
    run = _copy(saved_run, tmp_path / "run")
    _meta(run, lambda m: m["side"].update(device="cpu\x1b[2J\x07\u202e\u200b"))
    code, out, err = cli(["generate-diff", str(saved_run), str(run)])
    check_clean(code, out, err, "escaped device")
    assert code == 0 and "\\x1b[2J\\x07\\u202e\\u200b" in out


def _subprocess_cli(args: list[str], *, address_space: int | None, timeout: float):
    """The CLI in a child process (under an address-space limit, if given)."""

    def limit() -> None:
        if address_space is not None:
            import resource

            resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    env = {**os.environ, "PYTHONPATH": str(SRC)}
    return subprocess.run(
        [sys.executable, "-m", "precguard", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        preexec_fn=limit,
        check=False,
    )


def test_a_fifo_or_a_sparse_prompt_file_is_refused_without_reading_it(
    saved_run: Path, tmp_path: Path
) -> None:
    fifo = _copy(saved_run, tmp_path / "fifo")
    (fifo / "prompt-0.safetensors").unlink()
    os.mkfifo(fifo / "prompt-0.safetensors")
    # a header that claims 12 GiB of logits, and a sparse file that has them: the header
    # is valid and the tensors tile the file, so only the size guard stands in the way
    sparse = _copy(saved_run, tmp_path / "sparse")
    header = json.dumps({"scores": {"dtype": "F32", "shape": [3, 1 << 30],
                                    "data_offsets": [0, 12 * GiB]}}).encode()  # fmt: skip
    with open(sparse / "prompt-0.safetensors", "wb") as fh:
        fh.write(len(header).to_bytes(8, "little") + header)
        fh.truncate(8 + len(header) + 12 * GiB)
    for run, said in ((fifo, "a FIFO"), (sparse, "refused unread")):
        proc = _subprocess_cli(
            ["generate-diff", str(saved_run), str(run)], address_space=4 * GiB, timeout=120
        )
        check_clean(proc.returncode, proc.stdout, proc.stderr, str(run))
        assert proc.returncode == 2 and said in proc.stderr, proc.stderr


def test_saved_runs_fuzzed(saved_run: Path, tmp_path: Path) -> None:
    rng = random.Random(31)
    meta = json.loads((saved_run / "generation.json").read_text(encoding="utf-8"))
    paths = [(k,) for k in meta] + [("side", k) for k in meta["side"]]
    paths += [("prompts", 0, k) for k in meta["prompts"][0]]
    codes: dict[int, int] = {}
    for case in range(40):
        run = _copy(saved_run, tmp_path / f"c{case}")
        mutant = json.loads(json.dumps(meta))
        for _ in range(rng.randint(1, 3)):
            *parents, leaf = rng.choice(paths)
            node = mutant
            for p in parents:  # an earlier mutation may have replaced a parent
                try:
                    node = node[p]
                except (KeyError, IndexError, TypeError):
                    node = None
            if isinstance(node, dict):
                node[leaf] = _hostile_value(rng)
        (run / "generation.json").write_text(json.dumps(mutant), encoding="utf-8")
        code, out, err = cli(["generate-diff", str(saved_run), str(run)])
        check_clean(code, out, err, f"saved-run case {case}")
        codes[code] = codes.get(code, 0) + 1
        shutil.rmtree(run)
    assert codes.get(2, 0) >= 20, codes


# -- watch directories ---------------------------------------------------------------------


def _append(name: str, line: str) -> Callable[[Path], None]:
    def change(w: Path) -> None:
        with open(w / name, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    return change


def _alert(message: object) -> str:
    return json.dumps({"kind": "loss_spike", "step": 1, "message": message, "layers": []})


WATCH_PROBES: dict[str, tuple[Callable[[Path], object], str]] = {
    "100k-deep watch.json": (lambda w: (w / "watch.json").write_text(_deep()), "not valid JSON"),
    "100k-deep alerts line": (_append("alerts.jsonl", _deep()), "not valid JSON"),
    "a layers line without its step": (
        _append("layers.jsonl", json.dumps({"grad_norm": [1.0] * 4, "update_ratio": [1.0] * 4})),
        "field 'step'"),
    "a 401-digit loss": (_append("scalars.jsonl", '{"step": 6, "loss": ' + "9" * 401 + "}"),
                         "field 'loss"),
    "a dict as the loss": (_append("scalars.jsonl", '{"step": 6, "loss": {"a": 1}}'),
                           "field 'loss"),
    "a 2 MiB alert line": (_append("alerts.jsonl", _alert("A" * (2 << 20))), "longer than"),
    # refused by its size where memory is small, else by its first line's length
    "a sparse 6 GiB scalars.jsonl": (
        lambda w: _grow(w / "scalars.jsonl", 6 * GiB), "longer than|refused unread"),
    "a FIFO as scalars.jsonl": (
        lambda w: ((w / "scalars.jsonl").unlink(), os.mkfifo(w / "scalars.jsonl")), "a FIFO"),
    "layers.jsonl a link leading outside": (
        lambda w: ((w / "layers.jsonl").unlink(), (w / "layers.jsonl").symlink_to("/etc/passwd")),
        "leads outside"),
    "a boolean step": (_append("scalars.jsonl", '{"step": true}'), "field 'step'"),
}  # fmt: skip


@pytest.mark.parametrize("probe", list(WATCH_PROBES))
def test_a_hostile_watch_directory_is_refused_in_one_line(
    watch_dir: Path, tmp_path: Path, probe: str
) -> None:
    mutate, said = WATCH_PROBES[probe]
    w = _copy(watch_dir, tmp_path / "w")
    mutate(w)
    code, out, err = cli(["watch-report", str(w), "--csv", str(tmp_path / "w.csv")])
    check_clean(code, out, err, probe)
    assert code == 2 and any(s in err for s in said.split("|")), (probe, err)
    assert not (tmp_path / "w.csv").exists()


def test_an_alert_with_control_characters_is_printed_escaped(
    watch_dir: Path, tmp_path: Path
) -> None:
    w = _copy(watch_dir, tmp_path / "w")
    _append("alerts.jsonl", _alert("spike \x1b[2J\x07\u202e" + "x" * 5000))(w)
    code, out, err = cli(["watch-report", str(w)])
    check_clean(code, out, err, "alert text")
    assert code == 1 and "\\x1b[2J\\x07\\u202e" in out
    assert max(len(line) for line in out.splitlines()) < 500  # a long message is cut


def test_a_watch_report_figure_escapes_its_labels(watch_dir: Path, tmp_path: Path) -> None:
    w = _copy(watch_dir, tmp_path / "w")
    info = json.loads((w / "watch.json").read_text())
    info["layers"] = [f"layer\x1b[31m{i}\u202e" for i in range(len(info["layers"]))]
    (w / "watch.json").write_text(json.dumps(info))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "Glyph 27 (\x1b) missing" would raise
        code, out, err = cli(["watch-report", str(w), "--html", str(tmp_path / "w.html")])
    check_clean(code, out, err, "figure labels")
    page = (tmp_path / "w.html").read_text(encoding="utf-8")
    assert code == 0 and "\x1b" not in page and "\\x1b[31m" in page


def test_watch_directories_fuzzed(watch_dir: Path, tmp_path: Path) -> None:
    rng = random.Random(32)
    fields = {
        "scalars.jsonl": ["step", "loss", "grad_norm", "nonfinite", "lr", "recorded"],
        "layers.jsonl": ["step", "grad_norm", "update_ratio"],
        "alerts.jsonl": ["kind", "step", "message", "layers", "value", "z"],
        "watch.json": ["schema_version", "layers", "model"],
    }
    codes: dict[int, int] = {}
    for case in range(40):
        w = _copy(watch_dir, tmp_path / f"c{case}")
        name = rng.choice(sorted(fields))
        if name == "watch.json":
            doc = json.loads((w / name).read_text())
            doc[rng.choice(fields[name])] = _hostile_value(rng)
            (w / name).write_text(json.dumps(doc))
        else:
            row = json.loads(_alert("x")) if name == "alerts.jsonl" else {"step": 6}
            row[rng.choice(fields[name])] = _hostile_value(rng)
            if rng.random() < 0.3:
                row[_hostile_text(rng)] = _hostile_value(rng)
            _append(name, json.dumps(row))(w)
        args = ["watch-report", str(w)] + (["--csv", str(tmp_path / "f.csv")] if case % 2 else [])
        code, out, err = cli(args)
        check_clean(code, out, err, f"watch case {case}: {name}")
        codes[code] = codes.get(code, 0) + 1
        shutil.rmtree(w)
    assert codes.get(2, 0) >= 15, codes


# -- graph files and layout specs ----------------------------------------------------------


def _graph_file(path: Path) -> Path:
    from precguard.graph.model import OpGraph, OpNode, TensorMeta

    t = TensorMeta(dtype="float32", shape=[2, 4])
    ops = ["matmul", "add", "relu"]
    nodes = [
        OpNode(id=i, op=op, target=f"torch.{op}", module="root.fc", inputs=[t], outputs=[t])
        for i, op in enumerate(ops)
    ]
    graph = OpGraph(source="op-trace", level="function", device="cpu", nodes=nodes)
    path.write_text(graph.model_dump_json(indent=1), encoding="utf-8")
    return path


def test_graph_files_fuzzed(tmp_path: Path) -> None:
    golden = _graph_file(tmp_path / "golden.json")
    base = json.loads(golden.read_text())
    rng = random.Random(33)
    codes: dict[int, int] = {}
    for case in range(40):
        doc = json.loads(json.dumps(base))
        op = rng.randrange(5)
        if op == 0:
            node = rng.choice(doc["nodes"])
            node[rng.choice(["id", "op", "module", "call", "inputs"])] = _hostile_value(rng)
        elif op == 1:
            rng.choice(doc["nodes"])["outputs"][0]["shape"] = [_hostile_value(rng)]
        elif op == 2:
            doc[rng.choice(["device", "level", "source", "schema_version"])] = _hostile_value(rng)
        elif op == 3:
            doc = _hostile_value(rng)
        else:
            node = rng.choice(doc["nodes"])
            node["module"] = _hostile_text(rng, 30)
        actual = tmp_path / f"a{case}.json"
        text = _deep(rng.choice([10, 100_000])) if op == 3 and rng.random() < 0.3 else None
        actual.write_text(text if text is not None else json.dumps(doc), encoding="utf-8")
        code, out, err = cli(["graph", "diff", str(golden), str(actual)])
        check_clean(code, out, err, f"graph case {case}")
        codes[code] = codes.get(code, 0) + 1
    assert codes.get(2, 0) >= 10 and codes.get(0, 0) + codes.get(1, 0) >= 5, codes


def test_a_fifo_or_sparse_graph_file_or_layout_spec_is_refused_unread(tmp_path: Path) -> None:
    from precguard import PrecguardError
    from precguard.layout import load_layout

    golden = _graph_file(tmp_path / "golden.json")
    fifo = tmp_path / "graph.json"
    os.mkfifo(fifo)
    code, out, err = cli(["graph", "diff", str(golden), str(fifo)])  # would block if read
    check_clean(code, out, err, "a FIFO graph file")
    assert code == 2 and "a FIFO" in err
    # a sparse layout spec is refused by its size, unread
    spec = tmp_path / "layout.yaml"
    spec.write_text("rules: []\n")
    _grow(spec, 4 * GiB)
    with pytest.raises(PrecguardError, match="larger than"):
        load_layout(spec)
    # a sparse graph file too
    graph = _graph_file(tmp_path / "big.json")
    _grow(graph, 4 * GiB)
    code, out, err = cli(["graph", "diff", str(golden), str(graph)])
    check_clean(code, out, err, "a sparse graph file")
    assert code == 2 and "larger than" in err


# -- outputs written whole or not at all ---------------------------------------------------


def test_a_report_replaces_the_old_file_whole_or_leaves_it(tmp_path: Path) -> None:
    from precguard import UsageError
    from precguard.dump.atomic import atomic_output, write_atomic

    out = tmp_path / "report.json"
    out.write_text("old", encoding="utf-8")
    os.chmod(out, 0o640)
    with pytest.raises(RuntimeError), atomic_output(out, what="--json") as fh:
        fh.write("half")
        raise RuntimeError("the writer died")
    assert out.read_text() == "old" and sorted(tmp_path.iterdir()) == [out]
    write_atomic(out, "new", what="--json")
    assert out.read_text() == "new" and (out.stat().st_mode & 0o777) == 0o640
    # a link the user keeps at the output's name is followed, and stays a link
    real = tmp_path / "web" / "report.json"
    real.parent.mkdir()
    real.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    write_atomic(link, "{}", what="--json")
    assert link.is_symlink() and real.read_text() == "{}"
    assert sorted(p.name for p in real.parent.iterdir()) == ["report.json"]
    with pytest.raises(UsageError, match="--json"):
        write_atomic(tmp_path / "no-such-folder" / "r.json", "{}", what="--json")
    # a pipe (--json /dev/stdout, a FIFO) is a stream: written to, not replaced
    import threading

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, "streamed", what="--json")
    reader.join(timeout=60)
    assert got == [b"streamed"] and fifo.is_fifo()


def test_bitwise_hashes_from_a_recording_are_cut_and_escaped() -> None:
    from precguard.compare.bitwise import BitwiseComparison, BitwiseDifference, render_bitwise

    diff = BitwiseDifference(key="k", module="m", module_type="Linear", step=0, rank=0,
                             reason="hash", golden_hash="\x1b[2J" + "a" * 5107,
                             actual_hash="b" * 16)  # fmt: skip
    text = render_bitwise(
        BitwiseComparison(
            golden="g",
            actual="a",
            verdict="differs",
            compared=1,
            equal=0,
            unhashed=0,
            first_difference=diff,
            differences=[diff],
            total_differences=1,
        )
    )
    assert "\x1b" not in text and max(len(line) for line in text.splitlines()) < 300


# -- every command on one hostile recording: no control character reaches the terminal -----

#: ESC, BEL, a bidi override, a zero-width space and a C1 CSI: in names, device and paths
EVIL = "\x1b[2J\x07\u202e\u200b\x9b"
#: what no command may print raw: C0 and C1 controls (but newline and tab), DEL, bidi
#: controls and zero-width characters
RAW = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069]")
MSPROBE = Path(__file__).parent / "interop" / "fixtures" / "msprobe" / "stats_fault"


def _poison(run: Path) -> None:
    """Put EVIL in the manifest's strings and in every name under ``model.layers.1``."""
    _set = json.loads((run / "manifest.json").read_text(encoding="utf-8"))
    _set.update(device=_set["device"] + EVIL, target="t" + EVIL, model="M" + EVIL)
    (run / "manifest.json").write_text(json.dumps(_set), encoding="utf-8")
    records = run / "rank0" / "records.jsonl"
    lines = []
    for line in records.read_text(encoding="utf-8").splitlines():
        rec = json.loads(line)
        for field in ("module", "key"):  # the tensor pointers stay as saved
            rec[field] = rec[field].replace("model.layers.1", "model.layers.1" + EVIL)
        rec["module_type"] += EVIL
        lines.append(json.dumps(rec))
    records.write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture(scope="module")
def hostile_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Golden and actual tiny-llama recordings in directories named EVIL, with EVIL names.

    The actual's ``model.layers.1.mlp.down_proj`` is scaled, so compare names it.
    """
    import precguard

    root = tmp_path_factory.mktemp("hostile")
    kw = {"steps": 1, "tensors": ["model.layers.0.*"]}

    def fault(model: nn.Module) -> None:
        with torch.no_grad():
            model.model.layers[1].mlp.down_proj.weight.mul_(1.5)

    golden = precguard.record_target("tiny-llama", out=root / "g", **kw)
    actual = precguard.record_target("tiny-llama", out=root / "a", prepare=fault, **kw)
    pair = []
    for run, name in ((golden, "golden"), (actual, "actual")):
        _poison(run)
        pair.append(run.rename(root / (name + EVIL)))
    return pair[0], pair[1]


def _run_clean(args: list[str]) -> str:
    """Run one command; fail on a traceback, a refusal of more than one line, or a raw
    control character. What it printed, for the caller's own checks."""
    with warnings.catch_warnings(record=True) as caught:  # the CLI prints them on stderr
        warnings.simplefilter("always")
        code, stdout, stderr = cli(args)
    stderr += "".join(f"{w.category.__name__}: {w.message}\n" for w in caught)
    what = " ".join(a.replace(EVIL, "EVIL") for a in args[:2])
    check_clean(code, stdout, stderr, what)
    raw = sorted(set(RAW.findall(stdout + stderr)))
    assert not raw, f"{what}: raw {raw} reached the terminal:\n{stdout}{stderr}"
    return stdout + stderr


def _commands() -> set[str]:
    """Every command in the CLI's table (a group's subcommands as ``graph export``)."""
    from typer.main import get_command

    from precguard.cli import app

    root = get_command(app)
    names = set()
    for name, command in root.commands.items():  # type: ignore[attr-defined]
        subs = getattr(command, "commands", None)
        names |= {f"{name} {sub}" for sub in subs} if subs else {name}
    return names


def _covers(commands: list[list[str]]) -> set[str]:
    return {" ".join(a[:2]) if a[0] == "graph" else a[0] for a in commands}


def test_every_command_prints_no_raw_control_character_on_a_hostile_recording(
    hostile_pair: tuple[Path, Path], saved_run: Path, tmp_path: Path
) -> None:
    golden, actual = (str(p) for p in hostile_pair)
    out = tmp_path / ("out" + EVIL)
    out.mkdir()
    saved = _copy(saved_run, tmp_path / ("run" + EVIL))
    _meta(saved, lambda m: m["side"].update(device="cpu" + EVIL))
    dump = shutil.copytree(MSPROBE, tmp_path / ("dump" + EVIL))
    commands = [
        ["compare", golden, actual],
        ["compare", golden, actual, "--json", str(out / "c.json"), "--csv",
         str(out / "c.csv"), "--html", str(out / "c.html")],
        ["compare", golden, actual, "--json", "-"],
        ["compare", golden, str(out / "missing")],
        ["report", str(out / "c.json"), "--html", str(out / "r.html"), "--csv", str(out / "r.csv")],
        ["bitwise", golden, actual],
        ["ranks", actual],
        ["graph", "diff", golden, actual],
        ["replay", golden, "-m", "model.layers.0.mlp", "-t", "tiny-llama"],
        ["replay", golden, "-m", "model.layers.1" + EVIL, "-t", "tiny-llama"],
        ["generate-diff", str(saved_run), str(saved), "--json", "-"],
        ["import-msprobe", str(dump), "--out", str(out / "imported")],
        ["compare", str(dump), str(out / "imported")],
    ]  # fmt: skip
    said = "".join(_run_clean(args) for args in commands)
    # the names were shown (escaped), not dropped: the test saw what it guards
    assert "model.layers.1\\x1b[2J\\x07\\u202e\\u200b\\x9b" in said
    assert "wrote" in said and "out\\x1b[2J" in said


@pytest.fixture(scope="module")
def hostile_golden_of_a_fault(hostile_pair: tuple[Path, Path], tmp_path_factory) -> Path:
    """The faulty actual as a golden ``check`` can use: its model name back to the
    target's, every other string still EVIL (a golden of another model is refused)."""
    golden = _copy(hostile_pair[1], tmp_path_factory.mktemp("check") / ("golden" + EVIL))
    manifest = json.loads((golden / "manifest.json").read_text(encoding="utf-8"))
    manifest["model"] = "LlamaForCausalLM"
    (golden / "manifest.json").write_text(json.dumps(manifest), encoding="utf-8")
    return golden


def test_check_and_every_other_command_print_no_raw_control_character(
    hostile_pair: tuple[Path, Path], hostile_golden_of_a_fault: Path, tmp_path: Path
) -> None:
    """``check`` against a hostile golden, and each command the test above does not run,
    given hostile text where it takes it: a name, a device, a path, an unknown option."""
    golden = str(hostile_golden_of_a_fault)
    out = tmp_path / ("out" + EVIL)
    out.mkdir()
    (out / "checklist.yaml").write_text("name: " + json.dumps(EVIL) + "\nchecks: [nope]\n")
    commands = [
        ["check", "-t", "tiny-llama", "--golden", golden, "--only",
         "layerwise.first_divergence", "--json", str(out / "d.json"), "--html",
         str(out / "d.html"), "--junit-xml", str(out / "j.xml")],
        ["check", "-t", "tiny-llama", "--only", "nosuch" + EVIL],
        ["check", "-c", str(out / "checklist.yaml"), "-t", "tiny-llama"],
        ["check", "-t", "tiny-llama" + EVIL],
        ["check", "-t", "tiny-llama", "--fingerprints-out", str(out / "fp")],
        ["record", "-t", "tiny-llama" + EVIL, "--out", str(out / "r")],
        ["schema", "manifest" + EVIL],
        ["plugins"],
        ["env", "-d", "emu:bf16" + EVIL],
        ["env", "-d", "emu:bf16" + EVIL, "--json"],
        ["bisect", "-d", "emu:bf16", "-t", "tiny-llama" + EVIL],
        ["bisect", golden, "-d", "emu:bf16", "-t", "tiny-llama"],  # an extra argument
        ["op-check", "-d", "emu:bf16" + EVIL],
        ["op-check", "-d", "emu:bf16", "-t", "tiny-llama", "-m", "model.layers.1" + EVIL],
        ["watch-report", str(out / "no-watch")],
        ["graph", "export", "-t", "tiny-llama" + EVIL, "--out", str(out / "g.json")],
        ["compare", "--" + EVIL, golden, golden],  # an unknown option is quoted back
    ]  # fmt: skip
    said = "".join(_run_clean(args) for args in commands)
    # check named the hostile layer (escaped) and announced its files in a hostile folder
    assert "model.layers.1\\x1b[2J" in said and "wrote" in said and "out\\x1b[2J" in said
    # with the test above, every command of the CLI's table is run on hostile text
    above = {"compare", "report", "bitwise", "ranks", "graph diff", "replay", "generate-diff",
             "import-msprobe"}  # fmt: skip
    assert _commands() <= _covers(commands) | above, _commands() - _covers(commands) - above
