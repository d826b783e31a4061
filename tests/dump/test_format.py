"""The recording format: schema, atomic writes, a SIGKILLed run, no pickle."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import precguard
from precguard import DumpFormatError


def test_schema_describes_manifest_and_record(capsys):
    from precguard.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["schema"])  # `precguard schema`: every file format's JSON Schema
    assert exc.value.code in (0, None)
    found = json.loads(capsys.readouterr().out)
    assert {"manifest", "record", "status"} <= set(found)
    assert {"rank", "complete", "steps", "error"} <= set(found["status"]["properties"])
    props = found["record"]["properties"]
    for field in (
        "key",
        "module",
        "module_type",
        "call",
        "phase",
        "role",
        "index",
        "step",
        "rank",
        "seq",
        "dtype",
        "shape",
        "stats",
        "tensor",
    ):
        assert field in props
        assert props[field].get("description")


KILLED_SCRIPT = textwrap.dedent(
    """
    import sys, torch, precguard
    from precguard.targets import build_tiny_llama, lm_batch
    torch.manual_seed(0)
    model = build_tiny_llama().eval()
    step = 0

    def halt_mid_step(module, args, output):
        if step == 4:  # in the middle of step 4's forward: say so, then wait to be killed
            print("mid-step", flush=True)
            sys.stdin.readline()

    model.model.layers[1].register_forward_hook(halt_mid_step)
    with torch.no_grad(), precguard.monitor(model, out=sys.argv[1], tensors=["model.layers.0.*"]):
        while True:
            model(**lm_batch(step))
            step += 1
    """
)


@pytest.mark.slow
def test_sigkilled_recording_is_readable(tmp_path):
    out = tmp_path / "run"
    script = tmp_path / "rec.py"
    script.write_text(KILLED_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])}
    proc = subprocess.Popen(
        [sys.executable, str(script), str(out)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        # killed at a known point (inside step 4), not after a sleep a loaded machine stretches
        assert proc.stdout.readline().strip() == "mid-step"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    run = precguard.load_run(out)
    assert run.manifest.complete is False
    records = list(run.records())
    steps = {r.step for r in records}
    assert {0, 1, 2, 3} <= steps
    for step in sorted(steps)[:-1]:  # every step before the last is whole
        keys = {r.key for r in records if r.step == step}
        assert "root.0.forward.output.0" in keys
    saved = [r for r in records if r.tensor is not None]
    assert saved
    for rec in saved[:20]:
        assert list(run.tensor(rec).shape) == rec.shape


def _write_run(tmp_path: Path) -> Path:
    import torch

    out = tmp_path / "run"
    model = torch.nn.Linear(3, 3)
    with torch.no_grad(), precguard.monitor(model, out=out, tensors=True):
        model(torch.ones(2, 3))
    return out


def test_truncated_last_line_is_skipped(tmp_path, caplog):
    out = _write_run(tmp_path)
    path = out / "rank0" / "records.jsonl"
    n = len(path.read_text().splitlines())
    with open(path, "a") as fh:
        fh.write('{"key": "half-writ')
    with caplog.at_level("WARNING", logger="precguard"):
        assert len(list(precguard.load_run(out).records())) == n
    assert any("truncated_last_line_skipped" in r.getMessage() for r in caplog.records)


def test_corrupt_middle_line_names_file_and_line(tmp_path):
    out = _write_run(tmp_path)
    path = out / "rank0" / "records.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = "not json\n"
    path.write_text("".join(lines))
    with pytest.raises(DumpFormatError, match=r"records\.jsonl line 2: expected a JSON object"):
        list(precguard.load_run(out).records())


def test_newer_schema_and_missing_manifest(tmp_path):
    out = _write_run(tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    manifest["schema_version"] += 1  # one newer than this precguard writes
    (out / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(DumpFormatError, match="newer"):
        precguard.load_run(out)
    with pytest.raises(DumpFormatError, match="no such recording"):
        precguard.load_run(tmp_path / "nope")
    (out / "manifest.json").unlink()
    with pytest.raises(DumpFormatError, match=r"manifest\.json: missing"):
        precguard.load_run(out)


def test_truncated_safetensors_is_reported(tmp_path):
    out = _write_run(tmp_path)
    run = precguard.load_run(out)
    rec = next(r for r in run.records() if r.tensor is not None)
    f = out / "rank0" / rec.tensor.file
    f.write_bytes(f.read_bytes()[:40])
    with pytest.raises(DumpFormatError, match="truncated or corrupt safetensors file"):
        precguard.load_run(out).tensor(rec)


def test_nothing_pickled(tmp_path):
    out = _write_run(tmp_path)
    files = [p for p in out.rglob("*") if p.is_file()]
    assert {p.suffix for p in files} <= {".json", ".jsonl", ".safetensors"}
    for p in files:
        assert not p.read_bytes().startswith(b"\x80")  # pickle protocol marker
    json.loads((out / "manifest.json").read_text())  # strict JSON
    for line in (out / "rank0" / "records.jsonl").read_text().splitlines():
        json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON {c}"))
