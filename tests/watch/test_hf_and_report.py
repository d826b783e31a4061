"""The watch in an HF Trainer, then read back: watch-report, compare on the recorded steps."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
import torch

from precguard.cli import main
from precguard.compare import compare_recordings as compare_runs
from precguard.targets import build_tiny_llama, lm_batch


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
    out, err = capsys.readouterr()
    return info.value.code or 0, out, err


def _train_with_trainer(out: Path, steps: int = 4) -> Path:
    from transformers import Trainer, TrainingArguments

    from precguard.training.hf import PrecguardWatchCallback

    torch.manual_seed(0)
    model = build_tiny_llama(num_hidden_layers=2)
    data = []
    for step in range(steps * 2):
        ids = lm_batch(step, batch=1, seq=16)["input_ids"][0]
        data.append({"input_ids": ids, "labels": ids})
    args = TrainingArguments(
        output_dir=str(out / "trainer"),
        max_steps=steps,
        per_device_train_batch_size=2,
        learning_rate=1e-3,
        report_to=[],
        save_strategy="no",
        logging_strategy="no",
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    callback = PrecguardWatchCallback(out / "watch", every=2)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[callback])
    trainer.train()
    assert callback.handle is not None and callback.handle.closed
    return out / "watch"


@pytest.fixture(scope="module")
def trainer_watch(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _train_with_trainer(tmp_path_factory.mktemp("hf"))


def test_the_trainer_callback_watches_every_step_and_records_every_second(
    trainer_watch: Path,
) -> None:
    scalars = [json.loads(x) for x in (trainer_watch / "scalars.jsonl").read_text().splitlines()]
    assert [s["step"] for s in scalars] == list(range(4))
    # the loss came from the model's output, the norms from backward, the lr from the optimizer
    assert all(s["loss"] > 0 and s["grad_norm"] > 0 for s in scalars)
    assert scalars[0]["lr"][0] > scalars[-1]["lr"][0] >= 0  # the Trainer's linear decay
    assert [s["step"] for s in scalars if s["recorded"]] == [0, 2]
    info = json.loads((trainer_watch / "watch.json").read_text())
    assert info["complete"] and info["steps"] == 4
    assert "model.layers.1.mlp.down_proj.weight" in info["layers"]
    # the Trainer's AdamW state is in the recorded steps
    records = (trainer_watch / "recording" / "rank0" / "records.jsonl").read_text()
    assert '"optimizer.exp_avg_sq.weight"' in records


def test_compare_works_on_two_watches_recorded_steps(trainer_watch: Path, tmp_path: Path) -> None:
    again = _train_with_trainer(tmp_path)
    result = compare_runs(trainer_watch / "recording", again / "recording")
    assert result.verdict == "match"
    assert {r.key.split(".backward.")[0] for r in result.records if ".backward.param." in r.key}


def test_watch_report_writes_html_and_csv(trainer_watch: Path, tmp_path: Path, capsys) -> None:
    html, table = tmp_path / "w.html", tmp_path / "w.csv"
    code, out, _err = run_cli(
        ["watch-report", str(trainer_watch), "--html", str(html), "--csv", str(table)], capsys
    )
    assert code == 0, out
    page = html.read_text()
    assert "update/param ratio per layer" in page and "<svg" in page
    rows = list(csv.DictReader(io.StringIO(table.read_text())))
    assert [int(r["step"]) for r in rows] == list(range(4))
    assert float(rows[2]["update_ratio:model.layers.0.mlp.up_proj.weight"]) > 0


def test_watch_report_refuses_what_is_not_a_watch_in_one_line(tmp_path: Path, capsys) -> None:
    code, _out, err = run_cli(["watch-report", str(tmp_path)], capsys)
    assert code == 2
    assert err.count("\n") == 1 and "no watch.json" in err
