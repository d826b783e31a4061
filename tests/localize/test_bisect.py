"""``precguard bisect``: without a golden run, name the modules a device gets wrong.

The user's story: a model gives a worse output on an fp16 chip (``emu:fp16``
here); they ask which modules must run at reference precision for the output
to match the CPU in fp32, and get the fragile norm by name, in a few probes.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from precguard import Side
from precguard.backends.cpu import CpuBackend
from precguard.localize.bisect import (
    Bisector,
    ReferencePrecision,
    bisect,
    correct_threshold,
    least_threshold,
    output_error,
    round_to_precision,
)
from tests.localize import models
from tests.localize.models import Decoder, decoder_target

MODELS = str(Path(models.__file__))


def test_a_module_that_overflows_in_fp16_is_the_culprit():
    result = bisect(Side(f"{MODELS}:one_overflow", "emu:fp16"))
    assert result.culprits == ["blocks.2.norm"]
    assert result.exit_code == 1
    assert result.baseline_error > result.threshold >= result.fixed_error
    # the first probe is the plain device run; one probe tests exactly the culprit set
    assert result.probes[0].at_reference == [] and not result.probes[0].passed
    assert any(p.at_reference == ["blocks.2.norm"] and p.passed for p in result.probes)
    assert result.probe_count == len(result.probes)


def test_two_independent_fragile_modules_are_both_found():
    result = bisect(Side(f"{MODELS}:two_overflows", "emu:fp16"))
    assert result.culprits == ["blocks.1.norm", "blocks.6.norm"]
    # neither alone is enough: that is why both are named
    alone = {tuple(p.at_reference): p.passed for p in result.probes}
    assert alone.get(("blocks.1.norm",)) is False
    assert alone.get(("blocks.6.norm",)) is False


def test_a_model_that_is_already_fine_has_no_culprits():
    result = bisect(Side(f"{MODELS}:fine", "emu:fp16"))
    assert result.culprits == []
    assert result.exit_code == 0
    assert result.probe_count == 1
    assert result.baseline_error <= result.threshold


def test_a_transformers_llama_layer_that_overflows_is_named_down_to_the_module():
    """tiny-llama (transformers, seeded init) with layer 1's down projection overflowing."""
    result = bisect(Side(f"{MODELS}:llama_overflow", "emu:fp16"))
    assert result.baseline_error == math.inf
    assert result.culprits == ["model.layers.1.mlp.down_proj"]
    # the blocks were searched before their children
    first_layer_probe = next(
        i for i, p in enumerate(result.probes) if p.at_reference == ["model.layers.1"]
    )
    first_child_probe = next(
        i for i, p in enumerate(result.probes)
        if any(n.startswith("model.layers.1.") for n in p.at_reference)
    )  # fmt: skip
    assert first_layer_probe < first_child_probe


def test_the_same_model_on_the_cpu_is_exact():
    result = bisect(Side(f"{MODELS}:one_overflow", "cpu"))
    assert result.culprits == [] and result.baseline_error == 0.0


def test_probes_grow_with_the_log_of_the_depth_not_the_depth():
    """One culprit among 16 blocks costs a few probes more than among 4, far fewer than 16."""
    counts = {}
    for blocks in (4, 16):
        result = bisect(Side(decoder_target(blocks, (blocks // 2,)), "emu:fp16"))
        assert result.culprits == [f"blocks.{blocks // 2}.norm"]
        counts[blocks] = result.probe_count
    assert counts[16] < 16
    # 4x the blocks adds about 2 log2(4) = 4 probes of binary search, not 12
    assert counts[16] - counts[4] <= 6, counts


def test_the_search_is_minimal_on_a_synthetic_oracle():
    """k culprits among many units: QuickXplain returns exactly them, in O(k log n) probes."""
    model = Decoder(blocks=64)
    called = {n or "root": i for i, (n, _) in enumerate(model.named_modules())}
    culprits = {"blocks.5.norm", "blocks.40.mlp"}

    def probe(names):
        fixed = {c for c in culprits if any(c == n or c.startswith(f"{n}.") for n in names)}
        return {"output": 0.0 if fixed == culprits else 1.0}

    search = Bisector(model, probe, called, thresholds={"output": 0.5})
    assert search.run() == ["blocks.5.norm", "blocks.40.mlp"]
    assert len(search.probes) < 2 * 2 * math.log2(66) + 12


def test_reference_precision_swaps_forward_and_restores_it():
    torch.manual_seed(0)
    device_model = Decoder(blocks=2, fragile=(0,)).eval()
    reference_model = Decoder(blocks=2, fragile=(0,)).eval().double()
    reference_model.load_state_dict(device_model.state_dict())
    x = torch.randn(2, 3, 16)
    plain = device_model(x)
    norm = device_model.blocks[0].norm
    with torch.no_grad():
        with ReferencePrecision(
            device_model, reference_model, ["blocks.0.norm"], CpuBackend("cpu"), torch.float64
        ):
            assert "forward" in norm.__dict__
            h = torch.randn(2, 3, 32)
            swapped = norm(h)
            # computed by the fp64 twin, handed back in the caller's dtype
            assert swapped.dtype == torch.float32
            torch.testing.assert_close(swapped, reference_model.blocks[0].norm(h.double()).float())
        assert "forward" not in norm.__dict__
    assert torch.equal(device_model(x), plain)


def test_reference_precision_restores_forward_when_the_forward_raises():
    model = Decoder(blocks=1)
    with (
        pytest.raises(RuntimeError),
        ReferencePrecision(
            model, Decoder(blocks=1), ["blocks.0"], CpuBackend("cpu"), torch.float32
        ),
    ):
        model.blocks[0](torch.randn(2, 5))  # wrong width: the twin raises
    assert "forward" not in model.blocks[0].__dict__


def test_output_error_metrics():
    ref = torch.tensor([1.0, -2.0, 2.0])
    got = torch.tensor([1.0, -2.0, 2.5])
    assert output_error(got, ref, "max_abs") == 0.5
    assert output_error(got, ref, "rel_l2") == pytest.approx(0.5 / 3)
    assert output_error(got, ref, "max_rel") == pytest.approx(0.25)
    assert output_error(torch.tensor([1.0, math.inf, 0.0]), ref) == math.inf
    assert output_error(ref, ref, "cosine") == 0.0


def test_the_threshold_is_what_a_correct_run_explains_beyond_its_floor():
    """sqrt(2) times the floor probe's error, never below one rounding and one reduction."""
    assert correct_threshold(0.01, torch.bfloat16, 256) == pytest.approx(0.01 * math.sqrt(2))
    # a float32 device: rounding float32 to float32 changes nothing, the floor can be 0
    assert correct_threshold(0.0, torch.float32, 256) == least_threshold(torch.float32, 256)
    assert 1e-6 < least_threshold(torch.float32, 256) < 2e-6
    assert least_threshold(torch.bfloat16) == 2**-8  # a scalar loss: one rounding
    assert math.isinf(correct_threshold(math.inf, torch.float16))


def test_rounding_to_a_named_precision_keeps_its_significand_bits():
    x = torch.tensor([1.0 + 2**-12, 3.0, -1.0 - 2**-9])
    assert torch.equal(round_to_precision(x, torch.bfloat16), x.bfloat16().float())
    # tfloat32: 11 significand bits, float32's range
    assert torch.equal(round_to_precision(x, "tfloat32"), x.half().float())
    assert round_to_precision(torch.tensor([1e30]), "tfloat32").item() == pytest.approx(1e30, 1e-3)


# -- the command line ------------------------------------------------------------------------


def _main(capsys, *args: str) -> tuple[int, str, str]:
    from precguard.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["bisect", *args])
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_cli_names_the_culprit_and_writes_json(capsys, tmp_path):
    path = tmp_path / "bisect.json"
    code, out, _ = _main(
        capsys, "--target", f"{MODELS}:one_overflow", "--device", "emu:fp16", "--json", str(path)
    )
    assert code == 1
    assert "blocks.2.norm" in out and "probe   0" in out
    data = json.loads(path.read_text())
    assert data["culprits"] == ["blocks.2.norm"]
    assert data["baseline_error"] > data["threshold"] >= data["fixed_error"]
    assert len(data["probes"]) == data["probe_count"] > 1
    assert {"at_reference", "error", "passed"} <= set(data["probes"][0])


def test_cli_exits_0_for_a_fine_model_with_json_on_stdout(capsys):
    code, out, _ = _main(capsys, "-t", f"{MODELS}:fine", "-d", "emu:fp16", "--json", "-")
    assert code == 0
    assert json.loads(out)["culprits"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--metric", "cosin"], "unknown metric 'cosin'"),
        (["--metric", "max_abs"], "needs --threshold"),
        (["--threshold", "-1"], "--threshold"),
        (["--device", "emu:nope"], "emu:nope"),
        (["--target", "no/such.py"], "no such file"),
        (["--target", f"{MODELS}:noisy"], "does not reproduce the reference"),
    ],
)
def test_cli_unusable_input_exits_2_with_one_line(capsys, args, message):
    base = {"--target": f"{MODELS}:fine", "--device": "emu:fp16"}
    for flag, value in zip(args[::2], args[1::2], strict=True):
        base[flag] = value
    code, _, err = _main(capsys, *[x for kv in base.items() for x in kv])
    assert code == 2
    assert message in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_cli_refuses_a_missing_target_like_record(capsys):
    """No silent default model: bisect of the wrong model answers a question nobody asked."""
    code, out, err = _main(capsys, "--device", "emu:fp16")
    assert code == 2 and out == ""
    assert "bisect needs --target" in err and "tiny-llama" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_cli_in_a_real_process(tmp_path):
    run = subprocess.run(
        [sys.executable, "-m", "precguard", "bisect", "-t", f"{MODELS}:two_overflows",
         "-d", "emu:fp16", "--json", str(tmp_path / "b.json")],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 1, run.stderr
    assert json.loads((tmp_path / "b.json").read_text())["culprits"] == [
        "blocks.1.norm",
        "blocks.6.norm",
    ]


@pytest.mark.parametrize("model", ["loud", "loud_output"])
def test_nonfinite_output_names_the_module_that_leaves_fp16s_range(model):
    # stored in fp16 on emu:fp16: every module's output is cast back to fp16, so where the
    # values themselves exceed 65504 no set of modules at reference precision fixes them
    result = bisect(Side(f"{MODELS}:{model}", "emu:fp16", "float16"))
    assert math.isinf(result.baseline_error)
    overflow = result.overflow
    assert overflow is not None and overflow.module == "gain" and overflow.module_type == "Gain"
    assert (overflow.format, overflow.format_max) == ("float16", 65504.0)
    assert overflow.nonfinite > 0 and overflow.input_absmax < 65504
    # the reference holds the values the format cannot: beyond its max
    assert overflow.reference_absmax is not None and overflow.reference_absmax > 65504
    assert result.exit_code == 1
    if model == "loud_output":
        assert result.culprits == [] and "no set of modules" in (result.note or "")


def test_finite_output_has_no_overflow_finding():
    result = bisect(Side(f"{MODELS}:one_overflow", "emu:fp16"))
    assert result.overflow is None


def test_every_floating_output_is_judged_not_only_the_loss_that_comes_first():
    """A model returning (loss, logits): its loss passes, its logits do not; bisect says so.

    The layers live under a namespace module whose forward never runs: its called
    members are the units, so the search reaches the fragile block's norm.
    """
    result = bisect(Side(f"{MODELS}:loss_first_overflow", "emu:fp16"))
    errors = result.output_errors
    assert set(errors) == {"output.0", "output.1"}
    limits = result.thresholds
    assert errors["output.0"] <= limits["output.0"] and errors["output.1"] > limits["output.1"]
    assert result.baseline_error == errors["output.1"]
    assert result.culprits == ["transformer.inner.blocks.2.norm"]
    assert result.units > 1
    assert all(set(p.outputs) == set(errors) for p in result.probes)


def test_a_one_pass_layernorm_in_bf16_is_named_where_16_eps_passed_it():
    """The second decoder's LayerNorm bug (mean and variance in one pass in bf16) moves the
    logits a few times what a correct run of the model explains, far under 16 bf16 eps
    (0.125): judged against the model's own floor, bisect names the norm."""
    from tests.compare.parallel_small import small_target

    result = bisect(Side(small_target("norm_low_precision"), "emu:bf16"))
    assert result.culprits == ["transformer.ln_f"]
    assert result.exit_code == 1
    logits = result.output_errors["output.1"]
    assert result.thresholds["output.1"] < logits < 0.125
    assert result.thresholds["output.1"] == pytest.approx(
        math.sqrt(2) * result.floor_errors["output.1"]
    )


@pytest.mark.parametrize("target", ["parallel-small", "tiny-llama"])
def test_a_correct_bf16_run_stays_within_its_floor(target):
    from tests.compare.parallel_small import small_target

    result = bisect(Side(small_target() if target == "parallel-small" else target, "emu:bf16"))
    assert result.culprits == [] and result.exit_code == 0 and result.probe_count == 1
    for name, err in result.output_errors.items():
        assert result.floor_errors[name] <= err * 1.01 <= result.thresholds[name]
