"""``precguard op-check``: is an op or a module of my model fragile on this chip, and does it
get worse with sequence length?

The user's story: a rotary embedding that computes its angles in the
activation dtype is fine on short prompts and garbage on long ones; op-check
shows the error growing with the number of positions, while the same module
computing its angles in fp32 stays flat.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

import precguard
from precguard.opcheck.measure import fit_growth, op_errors, ulp
from precguard.opcheck.sweep import batch_of_length, op_check
from tests.opcheck import rotary_models

MODELS = str(Path(rotary_models.__file__))


def _mean_errors(result, name):
    return {p.seq_len: p.mean_rel_err for p in result.results if (p.op or p.module) == name}


def test_rotary_angles_in_the_activation_dtype_grow_with_position_on_bf16():
    result = op_check(
        device="emu:bf16",
        target=f"{MODELS}:activation_dtype_rope",
        module="rotary_emb",
        seq_lens="128,4096",
    )
    errors = _mean_errors(result, "rotary_emb")
    assert errors[4096] > 10 * errors[128]
    assert result.growth["rotary_emb"].verdict == "grows"
    assert result.exit_code == 1
    assert {p.status for p in result.results} == {"fail"}


def test_rotary_angles_in_fp32_stay_flat_where_fp32_is_kept():
    """bf16 mixed precision keeps the fp32 islands: fp32 angles do not drift with position.

    (Plain ``emu:bf16`` rounds every op, the fp32 ones too, as a chip in an
    fp32-to-bf16 precision mode does; there both modules drift alike.)
    """
    bad = op_check(
        device="emu:bf16-mixed",
        target=f"{MODELS}:activation_dtype_rope",
        module="rotary_emb",
        seq_lens="128,4096",
    )
    good = op_check(
        device="emu:bf16-mixed", target=f"{MODELS}:fp32_rope", module="rotary_emb",
        seq_lens="128,4096",
    )  # fmt: skip
    assert good.dtype == "bfloat16"
    errors = _mean_errors(good, "rotary_emb")
    assert errors[4096] < 3 * errors[128]
    assert good.growth["rotary_emb"].verdict == "flat"
    assert good.exit_code == 0
    assert _mean_errors(bad, "rotary_emb")[4096] > 10 * _mean_errors(bad, "rotary_emb")[128]


def test_a_rotary_module_is_swept_up_to_the_models_maximum_length():
    result = op_check(device="cpu", target=f"{MODELS}:fp32_rope", module="rotary_emb")
    assert result.seq_lens[-1] == rotary_models.MAX_POSITIONS
    assert result.seq_lens[0] == 128
    assert result.exit_code == 0


def test_a_plain_module_runs_on_inputs_captured_at_each_length():
    result = op_check(
        device="emu:bf16", target=f"{MODELS}:fp32_rope", module="proj", seq_lens="24,96"
    )
    assert [p.seq_len for p in result.results] == [24, 96]
    assert all(p.status == "pass" and p.module == "proj" for p in result.results)
    # bf16 output rounding, no worse: about half an ULP of bf16 on average
    assert all(0 < p.mean_rel_err < 2**-7 for p in result.results)


def test_a_rotary_named_module_off_the_convention_is_swept_on_captured_inputs():
    result = op_check(
        device="emu:bf16-mixed", target=f"{MODELS}:stacked_rope", module="rotary_emb",
        seq_lens="24,96",
    )  # fmt: skip
    assert [p.seq_len for p in result.results] == [24, 96]
    assert result.exit_code == 0


def test_a_rotary_on_1d_positions_is_driven_on_1d_positions():
    """Issue 39: a hand-written rotary taking 1-D positions raised a raw RuntimeError."""
    result = op_check(
        device="emu:bf16", target=f"{MODELS}:one_dim_rope", module="rotary_emb",
        seq_lens="128,2048",
    )  # fmt: skip
    assert [p.seq_len for p in result.results] == [128, 2048]
    assert result.exit_code == 1  # its angles are in bf16: the long positions fail


def test_a_rotary_that_takes_neither_convention_falls_back_or_says_what_it_must_take():
    with pytest.raises(precguard.TargetError) as caught:
        op_check(
            device="emu:bf16", target=f"{MODELS}:length_rope", module="rotary_emb",
            seq_lens="128",
        )  # fmt: skip
    message = str(caught.value)
    assert "looks rotary but takes neither forward(x, position_ids) -> (cos, sin)" in message
    assert "\n" not in message
    # at its own 24 positions the captured inputs run: the documented fallback
    result = op_check(
        device="emu:bf16", target=f"{MODELS}:length_rope", module="rotary_emb", seq_lens="24"
    )
    assert [p.seq_len for p in result.results] == [24]


def test_builtin_ops_at_their_own_precision_pass_and_rope_on_bf16_fails():
    result = op_check(device="emu:bf16", ops=["rope", "softmax", "matmul"], seq_lens="64,512")
    by_op = {(p.op, p.seq_len): p for p in result.results}
    assert by_op[("softmax", 512)].status == "pass"
    assert by_op[("matmul", 512)].status == "pass"
    # every op rounds to bf16 on this profile: the fp32 angles of rope too
    assert by_op[("rope", 512)].status == "fail"
    assert result.growth["rope"].verdict == "grows"
    assert result.growth["softmax"].verdict == "flat"


def test_low_precision_accumulation_shows_as_matmul_error_growing_with_length():
    plain = op_check(device="emu:bf16", ops=["matmul"], seq_lens="64,4096")
    lowacc = op_check(device="emu:bf16-lowacc", ops=["matmul"], seq_lens="64,4096")
    assert plain.growth["matmul"].verdict == "flat"
    assert lowacc.growth["matmul"].verdict == "grows"


def test_on_the_cpu_every_builtin_op_passes():
    result = op_check(device="cpu", seq_lens="32,128")
    assert result.exit_code == 0, [p for p in result.results if p.status != "pass"]
    assert {p.op for p in result.results} == {
        "rope", "rmsnorm", "layernorm", "softmax", "attention", "matmul", "cross_entropy"
    }  # fmt: skip


def test_measure_and_growth_units():
    want = torch.tensor([1.0, -2.0, 4.0], dtype=torch.float64)
    got = torch.tensor([1.0, -2.0, 4.0 + 2**-8])
    m = op_errors(got, want, torch.bfloat16)
    assert m["max_abs_err"] == 2**-8
    assert m["max_rel_err"] == pytest.approx(2**-10)
    # bf16 spacing at 4 is 2**-5: the error is 1/8 ULP
    assert m["ulp_err"] == pytest.approx(1 / 8)
    assert ulp(torch.tensor([1.0], dtype=torch.float64), torch.float16).item() == 2**-10
    assert op_errors(torch.tensor([math.nan, 0.0, 0.0]), want, torch.float32)["max_abs_err"] == (
        math.inf
    )
    grows = fit_growth([128, 1024, 4096], [1e-3, 8e-3, 3.2e-2], floor=1e-9)
    assert grows.verdict == "grows" and grows.slope == pytest.approx(1.0)
    assert fit_growth([128, 4096], [1e-3, 1.1e-3], floor=1e-9).verdict == "flat"
    # errors below the floor are rounding noise, not growth
    assert fit_growth([128, 4096], [1e-12, 1e-9], floor=1e-6).verdict == "flat"


def test_batch_of_length_tiles_and_cuts_ids_and_masks():
    batch = {"input_ids": torch.arange(6)[None], "attention_mask": torch.ones(1, 6)}
    longer = batch_of_length(batch, 15)
    assert longer["input_ids"].shape == (1, 15) and longer["attention_mask"].shape == (1, 15)
    assert longer["input_ids"][0, 6:12].tolist() == list(range(6))
    assert batch_of_length(batch, 4)["input_ids"].tolist() == [[0, 1, 2, 3]]


# -- the command line ------------------------------------------------------------------------


def _main(capsys, *args: str) -> tuple[int, str, str]:
    from precguard.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["op-check", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_cli_json_table_and_plot(capsys, tmp_path):
    path, png = tmp_path / "ops.json", tmp_path / "ops.png"
    code, out, _ = _main(
        capsys, "--device", "emu:bf16", "--ops", "rope,rmsnorm", "--seq-lens", "64,256",
        "--json", str(path), "--plot", str(png),
    )  # fmt: skip
    assert code == 1  # rope fails on a chip that rounds its fp32 angles to bf16
    assert "rope" in out and "rmsnorm" in out and "grows" in out
    data = json.loads(path.read_text())
    first = data["results"][0]
    assert {"op", "seq_len", "dtype", "max_abs_err", "mean_abs_err", "max_rel_err", "status"} <= (
        set(first)
    )
    assert first["dtype"] == "bfloat16"
    assert data["growth"]["rope"]["verdict"] == "grows"
    assert data["growth"]["rmsnorm"]["verdict"] == "flat"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_module_of_a_target_to_stdout(capsys):
    code, out, _ = _main(
        capsys, "-d", "emu:bf16-mixed", "-t", f"{MODELS}:fp32_rope", "-m", "rotary_emb",
        "--seq-lens", "128,1024", "--json", "-",
    )  # fmt: skip
    assert code == 0
    data = json.loads(out)
    assert [r["module"] for r in data["results"]] == ["rotary_emb", "rotary_emb"]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ops", "sofmax"], "unknown op 'sofmax'"),
        (["--seq-lens", "128,abc"], "--seq-lens"),
        (["--module", "rotary_emb"], "--module needs --target"),
        (["--target", f"{MODELS}:fp32_rope", "--module", "rotary"], "no module 'rotary'"),
        (["--device", "emu:nope"], "emu:nope"),
        (["--tolerance", "0"], "--tolerance"),
        (["--ops", "softmax", "--verify"], "--verify needs --target and --module"),
    ],
)
def test_cli_unusable_input_exits_2_with_one_line(capsys, args, message):
    code, _, err = _main(capsys, *args)
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
