"""Issue 31's probes of untrusted saved runs and watch directories, before/after in one table.

Each probe builds a hostile input from a clean saved run and a clean watch
directory, runs the CLI on it in a subprocess under ``/usr/bin/time -v``
(a timeout for the FIFO, a 4 GiB address-space limit for the sparse files)
and prints the command, exit code, wall time, peak resident memory and the
last line of stderr::

    python benchmarks/probe_untrusted.py --src /work/main/src     # before
    python benchmarks/probe_untrusted.py --src src                # after

The clean inputs are made once with the ``--src`` given (a tiny seeded
target, a few seconds). Sparse files cost no disk; the 300 MB alert line does
(300 MB in the work folder, removed afterwards).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "tests" / "generation" / "targets.py"
GiB = 1 << 30


def _clean_inputs(work: Path, env: dict[str, str]) -> tuple[Path, Path]:
    golden = work / "clean-golden"
    prompts = work / "one.jsonl"
    prompts.write_text(json.dumps({"text": "The quick brown fox"}) + "\n", encoding="utf-8")
    args = ["generate-diff", "-t", f"{TARGETS}:peaked", "--device", "cpu", "--save-run"]
    args += [str(golden), "--prompts", str(prompts), "-n", "4"]
    subprocess.run(
        [sys.executable, "-m", "precguard", *args],
        env=env,
        check=True,
        capture_output=True,
    )
    code = (
        "import torch, precguard\n"
        "from torch import nn\n"
        "torch.manual_seed(0)\n"
        "m = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))\n"
        "opt = torch.optim.AdamW(m.parameters(), lr=1e-3)\n"
        f"h = precguard.watch(m, opt, out={str(work / 'clean-watch')!r}, every=2)\n"
        "for s in range(6):\n"
        "    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(s))\n"
        "    loss = nn.functional.mse_loss(m(x), torch.sin(x[:, :4]))\n"
        "    loss.backward(); opt.step(); opt.zero_grad(); h.step(loss)\n"
        "h.close()\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True)
    return golden, work / "clean-watch"


def _meta(run: Path, change: Callable[[dict], None]) -> None:
    meta = json.loads((run / "generation.json").read_text(encoding="utf-8"))
    change(meta)
    (run / "generation.json").write_text(json.dumps(meta), encoding="utf-8")


def _deep(depth: int = 100_000) -> str:
    return "[" * depth + "]" * depth


def _alert(message: str) -> str:
    return json.dumps(
        {"kind": "loss_spike", "step": 1, "message": message, "layers": [], "value": 1.0}
    )


def _retensor(run: Path, extra: dict[str, object] | None = None, steps: int | None = None) -> None:
    from safetensors.torch import load_file, save_file

    tensors = load_file(str(run / "prompt-0.safetensors"))
    if steps is not None:
        tensors = {k: (v[:steps] if "scores" in k else v) for k, v in tensors.items()}
    tensors.update(extra or {})
    save_file(tensors, str(run / "prompt-0.safetensors"))


def _cases(outside: Path) -> list[tuple[str, str, Callable[[Path], None], dict]]:
    """(name, kind, mutate(copy), options): kind 'gen' compares the copy with itself."""
    import torch

    def zero_steps(r: Path) -> None:
        _retensor(r, steps=0)
        _meta(r, lambda m: (m.update(steps=0), [p.update(chosen=[], fed=[]) for p in m["prompts"]]))

    def fifo(r: Path) -> None:
        (r / "prompt-0.safetensors").unlink()
        os.mkfifo(r / "prompt-0.safetensors")

    def sparse_prompt(r: Path) -> None:
        with open(r / "prompt-0.safetensors", "r+b") as fh:
            fh.truncate(12 * GiB)

    def link_out(r: Path) -> None:
        shutil.copy(r / "prompt-0.safetensors", outside / "prompt-0.safetensors")
        (r / "prompt-0.safetensors").unlink()
        (r / "prompt-0.safetensors").symlink_to(outside / "prompt-0.safetensors")

    def watch_line(name: str, line: str) -> Callable[[Path], None]:
        def change(w: Path) -> None:
            with open(w / name, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")

        return change

    def sparse_scalars(w: Path) -> None:
        with open(w / "scalars.jsonl", "r+b") as fh:
            fh.truncate(6 * GiB)

    def big_alert(w: Path) -> None:
        with open(w / "alerts.jsonl", "w", encoding="utf-8") as fh:
            fh.write(_alert("A" * (300 * 1024 * 1024)) + "\n")

    def esc_alert(w: Path) -> None:
        watch_line("alerts.jsonl", _alert("spike \x1b[2J\x07\u202egnp.exe\u200b"))(w)

    def esc_device(r: Path) -> None:
        _meta(r, lambda m: m["side"].update(device="cpu\x1b[2J\x07\u202e\u200b"))

    return [
        ("saved run: 100k-deep generation.json", "gen",
         lambda r: (r / "generation.json").write_text(_deep()), {}),
        ("saved run: a tensor named cache/x", "gen",
         lambda r: _retensor(r, {"cache/x": torch.zeros(2)}), {}),
        ("saved run: prompt token id 10**30", "gen",
         lambda r: _meta(r, lambda m: m["prompts"][0]["ids"].__setitem__(0, 10**30)), {}),
        ("saved run: sampling with seed 10**30", "gen",
         lambda r: _meta(r, lambda m: m.update(sample=True, seed=10**30)), {}),
        ("saved run: sample with temperature 0", "gen",
         lambda r: _meta(r, lambda m: m.update(sample=True, temperature=0.0)), {}),
        ("saved run: a FIFO as prompt-0.safetensors", "gen", fifo, {"timeout": 90}),
        ("saved run: 12 GiB sparse prompt file (4 GiB limit)", "gen", sparse_prompt,
         {"limit": 4 * GiB}),
        ("saved run: prompt file a link leading outside", "gen", link_out, {}),
        ("saved run: 0 steps", "gen", zero_steps, {}),
        ("saved run: ESC/BEL/U+202E in the device name", "gen", esc_device, {}),
        ("watch: 100k-deep watch.json", "watch",
         lambda w: (w / "watch.json").write_text(_deep()), {}),
        ("watch: 100k-deep alerts line", "watch", watch_line("alerts.jsonl", _deep()), {}),
        ("watch: layers.jsonl line without step", "watch",
         watch_line("layers.jsonl", json.dumps({"grad_norm": [1] * 4, "update_ratio": [1] * 4})),
         {"csv": True}),
        ("watch: 401-digit loss", "watch",
         watch_line("scalars.jsonl", '{"step": 6, "loss": ' + "9" * 401 + "}"), {"csv": True}),
        ("watch: a dict as the loss", "watch",
         watch_line("scalars.jsonl", '{"step": 6, "loss": {"a": 1}}'), {"csv": True}),
        ("watch: 6 GiB sparse scalars.jsonl (4 GiB limit)", "watch", sparse_scalars,
         {"limit": 4 * GiB}),
        ("watch: a 300 MB alert line", "watch", big_alert, {}),
        ("watch: ESC/BEL/U+202E in an alert", "watch", esc_alert, {}),
    ]  # fmt: skip


def _run(cmd: list[str], env: dict[str, str], opts: dict) -> dict[str, object]:
    prefix = ["/usr/bin/time", "-v"]
    if "limit" in opts:
        prefix = ["prlimit", f"--as={opts['limit']}", *prefix]
    if "timeout" in opts:
        prefix = ["timeout", str(opts["timeout"]), *prefix]
    start = time.perf_counter()
    proc = subprocess.run([*prefix, *cmd], env=env, capture_output=True, check=False)
    wall = time.perf_counter() - start
    err = proc.stderr.decode("utf-8", "replace")
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", err)
    own = err.split("\tCommand being timed")[0]
    lines = [x for x in own.splitlines() if x.strip() and not x.startswith("Command exited")]
    out = proc.stdout
    return {
        "rc": "timeout" if proc.returncode == 124 else proc.returncode,
        "wall_s": round(wall, 1),
        "peak_mb": round(int(rss.group(1)) / 1024) if rss else None,
        "stderr": (lines[-1] if lines else "")[:110],
        "stdout_bytes": len(out),
        "raw_controls": any(c in out + proc.stderr for c in (b"\x1b", b"\x07", b"\xe2\x80\xae")),
    }


def main() -> None:
    """Build the inputs, run every probe, print the table (and JSON with --json)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", required=True, help="the precguard sources to probe")
    parser.add_argument("--json", help="also write the results here")
    parser.add_argument("--only", help="run only probes whose name holds one of these (a,b)")
    args = parser.parse_args()
    env = {**os.environ, "PYTHONPATH": str(Path(args.src).resolve())}
    results = []
    with tempfile.TemporaryDirectory(prefix="probe31-") as tmp:
        work = Path(tmp)
        golden, watch = _clean_inputs(work, env)
        outside = work / "outside"
        outside.mkdir()
        for i, (name, kind, mutate, opts) in enumerate(_cases(outside)):
            if args.only and not any(part in name for part in args.only.split(",")):
                continue
            copy = work / f"case{i}"
            shutil.copytree(golden if kind == "gen" else watch, copy, symlinks=True)
            mutate(copy)
            if kind == "gen":
                cmd = ["generate-diff", str(copy), str(copy)]
            else:
                cmd = ["watch-report", str(copy)]
                if opts.get("csv"):
                    cmd += ["--csv", str(work / f"case{i}.csv")]
            row = _run([sys.executable, "-m", "precguard", *cmd], env, opts)
            row["probe"] = name
            results.append(row)
            print(
                f"| {name} | {row['rc']} | {row['wall_s']} | {row['peak_mb']} | "
                f"{row['stdout_bytes']} | {'yes' if row['raw_controls'] else 'no'} | "
                f"{str(row['stderr']).replace('|', '/')} |",
                flush=True,
            )
            shutil.rmtree(copy, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1), encoding="utf-8")


if __name__ == "__main__":
    main()
