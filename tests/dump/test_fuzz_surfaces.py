"""Fuzz the newer surfaces: layout specs, msprobe dumps, saved results, report text.

Fixed seeds and fixed counts (no time budget): every case either works or is
refused with one ``precguard: error:`` line and exit 2; none may crash
("internal error", a traceback), and the HTML/CSV rendered from hostile names
must keep them as text.
"""

from __future__ import annotations

import csv
import io
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

import precguard
from tests.dump.test_fuzz import _engine

#: characters a hostile name draws from: markup, mathtext, formulas, separators, controls
HOSTILE = [*"$\\{}^_<>&\"'=+-@;,|\t\r\n\x00\x1b\u2028\u202e ", "$\\frac$", "=1+41", "é", "😀"]
MSPROBE = Path(__file__).parents[1] / "interop" / "fixtures" / "msprobe" / "stats"


def _hostile_text(rng: random.Random, n: int = 12) -> str:
    return "".join(rng.choice(HOSTILE + list("abcxyz019")) for _ in range(rng.randint(1, n)))


def _hostile_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(10)
    if kind == 0:
        return 10 ** rng.choice([20, 308, 309, 400, 4000])  # past a float's range
    if kind == 1:
        return -(10 ** rng.choice([309, 400]))
    if kind == 2:
        return rng.choice(["NaN", "inf", "-Infinity", "1e999", "", "0x10"])
    if kind == 3:
        return _hostile_text(rng)
    if kind == 4 and depth < 3:
        return [_hostile_value(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    if kind == 5 and depth < 3:
        return {_hostile_text(rng, 4): _hostile_value(rng, depth + 1)}
    if kind == 6:
        return rng.choice([None, True, False])
    if kind == 7:
        return rng.uniform(-1e6, 1e6)
    nest: Any = 0
    for _ in range(rng.choice([10, 200, 900])):  # json.dumps itself stops near 1000
        nest = [nest]
    return nest


def _check(code: int, out: str, err: str, what: str) -> None:
    engine = _engine()
    problems: list[str] = []
    engine._check_output(code, out, err, problems, what)
    assert not problems, problems[0]


def test_layout_specs_fuzzed(tmp_path: Path) -> None:
    from precguard import UsageError
    from precguard.layout import load_layout

    base = (Path(precguard.__file__).parent / "layouts" / "megatron.yaml").read_text()
    rng = random.Random(19)
    refused = loaded = 0
    for case in range(100):
        text = base
        op = rng.randrange(6)
        if op == 0:  # deep nesting, block or flow
            depth = rng.choice([40, 1000, 20_000])
            text = rng.choice(["- " * depth + "x", "[" * depth + "]" * depth, "{a: " * depth])
        elif op == 1:  # aliases, the billion-laughs shape
            text = "a: &a [x, x]\nb: &b [*a, *a]\nc: [*b, *b]\n"
        elif op == 2:  # bytes flipped
            raw = bytearray(text.encode())
            for _ in range(rng.randint(1, 8)):
                raw[rng.randrange(len(raw))] = rng.randrange(256)
            (tmp_path / "l.yaml").write_bytes(bytes(raw))
            text = None
        elif op == 3:  # values replaced with hostile ones
            text = text.replace("column", json.dumps(_hostile_value(rng)), 1)
        elif op == 4:
            text = text + "\n" + _hostile_text(rng, 40) + ": " + json.dumps(_hostile_value(rng))
        else:
            text = text * rng.choice([2, 60])  # repeated keys, or past the size bound
        if text is not None:
            (tmp_path / "l.yaml").write_text(text, encoding="utf-8", errors="surrogatepass")
        try:
            load_layout(tmp_path / "l.yaml")
            loaded += 1
        except UsageError as exc:
            assert "\n" not in str(exc).strip() or "YAML" in str(exc), (case, str(exc)[:200])
            refused += 1
    assert refused >= 40 and loaded >= 5, (refused, loaded)


_STAT_FIELDS = ("Max", "Min", "Mean", "Norm", "shape", "dtype", "type", "data_name")


def test_msprobe_dumps_fuzzed(tmp_path: Path) -> None:
    engine = _engine()
    rng = random.Random(23)
    codes: dict[int, int] = {}
    for case in range(40):
        src = shutil.copytree(MSPROBE, tmp_path / f"d{case}")
        dump_json = src / "step0" / "proc4242" / "dump.json"
        dump = json.loads(dump_json.read_text())
        entries = [
            e for v in dump["data"].values() for e in v.get("output", []) if isinstance(e, dict)
        ]
        for _ in range(rng.randint(1, 4)):
            entry = rng.choice(entries)
            entry[rng.choice(_STAT_FIELDS)] = _hostile_value(rng)
        if rng.random() < 0.2:
            dump["data"] = {_hostile_text(rng): v for v in dump["data"].values()}
        if rng.random() < 0.2:
            (src / "step0" / "proc4242" / "construct.json").write_text(
                json.dumps({_hostile_text(rng): _hostile_text(rng) for _ in range(5)})
            )
        dump_json.write_text(json.dumps(dump))
        out = tmp_path / f"o{case}"
        code, stdout, err = engine.run_cli(["import-msprobe", str(src), "--out", str(out)])
        _check(code, stdout, err, f"msprobe case {case}")
        if code == 2:
            assert not out.exists(), f"case {case}: a refused import left {out}"
        codes[code] = codes.get(code, 0) + 1
    assert codes.get(2, 0) >= 10 and codes.get(0, 0) >= 3, codes


@pytest.fixture(scope="module")
def saved_comparison(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("fuzz-report")
    for side, scale in (("g", 1.0), ("a", 1.01)):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4))
        model[0].register_forward_hook(lambda _m, _a, y, s=scale: y * s)
        with torch.no_grad(), precguard.monitor(model, out=root / side, tensors=True):
            model(torch.ones(2, 4))
    result = precguard.compare_runs(root / "g", root / "a")
    return json.loads(result.model_dump_json())


def test_saved_results_and_report_text_fuzzed(saved_comparison: dict, tmp_path: Path) -> None:
    engine = _engine()
    rng = random.Random(29)
    rendered = 0
    for case in range(8):
        raw = json.loads(json.dumps(saved_comparison))
        names = [_hostile_text(rng) for _ in raw["records"]]
        for rec, name in zip(raw["records"], names, strict=True):
            rec["module"] = name
            rec["key"] = name + ".0.forward.output.0"
        if raw.get("first_divergence"):
            raw["first_divergence"]["module"] = names[0]
        if case % 4 == 1:  # a field of the result given a hostile value
            rec = rng.choice(raw["records"])
            rec[rng.choice(["status", "metrics", "shape", "step"])] = _hostile_value(rng)
        if case % 4 == 2:
            raw["schema_version"] = rng.choice([0, 2, 999, "1", None])
        if case % 4 == 3:
            raw["golden"], raw["actual"] = "/etc", "/proc/self"
        saved = tmp_path / f"r{case}.json"
        saved.write_text(json.dumps(raw))
        page, table = tmp_path / f"r{case}.html", tmp_path / f"r{case}.csv"
        code, out, err = engine.run_cli(
            ["report", str(saved), "--html", str(page), "--csv", str(table)]
        )
        _check(code, out, err, f"report case {case}")
        if code != 0:
            continue
        rendered += 1
        text = page.read_text(encoding="utf-8")
        assert "<script" not in text.replace("<script>", "", 1) or text.count("<script") == 1
        rows = list(csv.reader(io.StringIO(table.read_text(encoding="utf-8"), newline="")))
        assert len(rows) == len(raw["records"]) + 1, f"case {case}: a name split a CSV row"
        for row in rows[1:]:
            for cell in row:
                stripped = cell.lstrip()
                if stripped[:1] in ("=", "+", "@") or (
                    stripped[:1] == "-" and not _is_number(stripped)
                ):
                    pytest.fail(f"case {case}: formula-like cell {cell!r}")
    assert rendered >= 3, rendered


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
