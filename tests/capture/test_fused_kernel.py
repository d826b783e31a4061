"""The compiled one-read kernel (``capture/_fused.cpp``) against exact arithmetic.

The statistics built on it are checked against the straightforward definition
in test_stats_paths.py (both ways, kernel and passes); here the kernel itself:
its sums to double rounding whatever the shape (ragged rows, rows longer than a
block, one element), its sample and binned per-position norms, both instruction
sets this CPU can run, the accuracy claims stats.py's one-pass rule rests on,
and the refusals of its C interface; and the encoding of the evidence it gathers.
"""

from __future__ import annotations

import base64
import json
import math
import os
import subprocess
import sys
from fractions import Fraction

import numpy as np
import pytest
import torch

from precguard.capture import stats
from precguard.capture.evidence import all_record_fields, encode, plan_for, record_fields

fused = stats._fused

#: set where precguard is installed without a C++ compiler on purpose (the passes then
#: compute the statistics, test_stats_paths.py checks them); otherwise a missing kernel
#: is a broken build and fails test_the_kernel_is_built
NO_KERNEL = os.environ.get("PRECGUARD_NO_KERNEL") == "1"
needs_kernel = pytest.mark.skipif(fused is None, reason="the one-read kernel is not built")

SHAPES = {
    "one": ((1,), torch.float32),
    "ragged": ((5, 37), torch.float32),
    "hidden": ((2, 40, 24), torch.float32),
    "heads": ((2, 3, 300, 16), torch.float32),  # positions binned by 2
    "long_rows": ((2, 3, 9001), torch.float32),  # rows of three blocks and a tail
    "float64": ((3, 50, 21), torch.float64),
}


#: the kernel's worst-case rounding relative to the sum of |terms|: blocks of 4096 summed
#: in 16 chains (256 additions each), a 4-level tree, Neumaier's total (_fused.cpp)
BOUND = Fraction(((fused.BLOCK if fused else 4096) // 16 + 21) * 2**-53)


@pytest.mark.skipif(NO_KERNEL, reason="PRECGUARD_NO_KERNEL=1: installed without the kernel")
def test_the_kernel_is_built():
    # `make test` installs with the system's C++ compiler: a missing kernel is a broken
    # build (setup.py's extension is optional, so pip says nothing), not the slow path
    assert fused is not None, (
        "precguard.capture._fused is missing: the C++ build failed or no compiler was found "
        "(reinstall with `pip install -v -e .` to see why; PRECGUARD_NO_KERNEL=1 skips this)"
    )
    assert stats.FUSED_KERNELS in ("avx2", "baseline")


@needs_kernel
def test_a_split_scan_runs_on_torchs_own_openmp_threads():
    # torch's CPU wheels bundle libgomp.so.1: the kernel built with OpenMP binds to the
    # libgomp.so.1 loaded first (torch's, as precguard imports torch first), so the
    # process holds one runtime and a split scan reuses torch's awake threads, splitting
    # from 32 Ki elements; a second runtime would mean cold threads spinning beside
    # torch's, and the old 1 Mi threshold
    bundled = os.path.join(os.path.dirname(torch.__file__), "lib", "libgomp.so.1")
    if not fused.OPENMP or not os.path.exists(bundled):
        pytest.skip("built without OpenMP, or a torch without its own libgomp")
    assert len(stats._openmp_runtimes()) == 1, stats._openmp_runtimes()
    assert stats.SHARED_POOL and stats.FUSED_SPLIT == 1 << 15


def exact_sums(t: torch.Tensor) -> tuple[Fraction, Fraction]:
    """The sum and sum of squares of ``t``'s values, exactly."""
    values = [Fraction(v) for v in t.double().reshape(-1).tolist()]
    return sum(values, Fraction(0)), sum((v * v for v in values), Fraction(0))


def scan(t: torch.Tensor, positions: bool, threads: int = 1) -> tuple[tuple, np.ndarray]:
    plan = plan_for(tuple(t.shape), t.device, positions)
    seq = plan.length if plan.seq_dim is not None else 0
    out = np.empty(
        plan.host_index.size + plan.bins, np.float64 if t.dtype == torch.float64 else np.float32
    )
    row = t.shape[-1]
    double = t.dtype == torch.float64
    result = fused.scan(
        t.data_ptr(), t.numel(), row, double, plan.host_index, out, seq, plan.bin, threads
    )
    return result, out


@needs_kernel
@pytest.mark.parametrize("threads", [1, 3], ids=["1-thread", "rows-split-3-ways"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_scan_matches_exact_arithmetic(name, threads):
    shape, dtype = SHAPES[name]
    torch.manual_seed(0)
    t = (torch.randn(shape, dtype=dtype) * 3 + 0.5).to(dtype)
    flat = t.reshape(-1)
    if flat.numel() > 7:
        flat[:: flat.numel() // 7] = 0.0  # zeros, counted
        flat[3] = -0.0
    (mn, mx, zeros, total, sumsq), out = scan(t, positions=True, threads=threads)
    want_sum, want_sq = exact_sums(t)
    assert (mn, mx) == (t.min().item(), t.max().item())
    assert zeros == int((t == 0).sum())
    scale = sum((abs(Fraction(v)) for v in flat.double().tolist()), Fraction(0))
    assert abs(Fraction(total) - want_sum) <= BOUND * scale
    assert abs(Fraction(sumsq) / want_sq - 1) <= BOUND
    plan = plan_for(tuple(t.shape), t.device, True)
    np.testing.assert_array_equal(out[: plan.host_index.size], flat.numpy()[plan.host_index])
    if plan.seq_dim is not None:
        seq = plan.seq_dim
        per = t.double().square().sum(dim=[d for d in range(t.dim()) if d != seq])
        pad = plan.bins * plan.bin - plan.length
        binned = torch.nn.functional.pad(per, (0, pad)).view(plan.bins, plan.bin).sum(1).sqrt()
        np.testing.assert_allclose(out[plan.host_index.size :], binned.numpy(), rtol=1e-7)


@needs_kernel
def test_the_spread_is_exact_to_double_rounding():
    torch.manual_seed(1)
    for dtype in (torch.float32, torch.float64):
        t = (torch.randn(3, 7001, dtype=torch.float64) * 1e-3 + 1e3).to(dtype)
        mean = t.double().mean().item()
        exact = sum((Fraction(v) - Fraction(mean)) ** 2 for v in t.double().reshape(-1).tolist())
        got = fused.spread(t.data_ptr(), t.numel(), dtype == torch.float64, mean)
        assert abs(Fraction(got) / exact - 1) <= BOUND, dtype


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_std_holds_the_tensor_dtypes_rounding_when_the_mean_dwarfs_it(dtype):
    # |mean| / std = 1e6: sum x^2 - n mean^2 loses twelve digits; the rule sees it and
    # takes the second read, so float32 std holds float32's rounding and float64 its own
    torch.manual_seed(2)
    t = (torch.randn(4096, dtype=torch.float64) * 1e-3 + 1e3).to(dtype)
    buf = stats.StatsBuffer(evidence=False)
    slot, _ = buf.add(t)
    got = buf.materialize()[slot]["std"]
    x = t.double()
    want = math.sqrt(((x - x.mean()) ** 2).sum().item() / (x.numel() - 1))
    tol = 2.0**-23 if dtype == torch.float32 else 1e-13
    assert abs(got / want - 1) <= tol


@needs_kernel
def test_both_instruction_sets_give_the_same_statistics(tmp_path):
    # the baseline build (any CPU) and, where the CPU has them, AVX2 with FMA: the same
    # numbers up to double rounding (FMA rounds once where the baseline rounds twice)
    script = """
import json, sys, torch
from precguard.capture import stats
torch.manual_seed(0)
rows = []
for shape in [(5, 37), (2, 40, 24), (2, 3, 9001), (4, 128, 2048)]:  # the last split in threads
    t = torch.randn(shape) * 2 + 0.25
    buf = stats.StatsBuffer()
    slot, _ = buf.add(t, positions=True)
    s, ev = buf.materialize_with_evidence()
    rows.append([s[slot], ev[slot]])
print(json.dumps({"kernels": stats.FUSED_KERNELS, "rows": rows}))
"""
    runs = {}
    for forced in ("", "baseline"):
        env = {**os.environ, "PRECGUARD_KERNELS": forced, "OMP_NUM_THREADS": "2"}
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
        )
        runs[forced] = json.loads(done.stdout)
    assert runs["baseline"]["kernels"] == "baseline"
    for a, b in zip(runs[""]["rows"], runs["baseline"]["rows"], strict=True):
        assert a[1]["sample"] == b[1]["sample"]
        for field in ("min", "max", "zeros", "numel", "nan", "inf"):
            assert a[0][field] == b[0][field], field
        for field in ("mean", "std", "l2"):
            assert math.isclose(a[0][field], b[0][field], rel_tol=1e-13, abs_tol=1e-15), field


@needs_kernel
def test_the_c_interface_refuses_what_it_cannot_read():
    t = torch.randn(4, 8)
    address, index = t.data_ptr(), np.array([0, 31], dtype=np.int64)
    with pytest.raises(ValueError, match="multiple of row"):
        fused.scan(address, 32, 5, False, None, None, 0, 1, 1)
    with pytest.raises(ValueError, match="multiple of row"):
        fused.scan(0, 32, 8, False, None, None, 0, 1, 1)
    with pytest.raises(IndexError):
        fused.scan(
            address, 32, 8, False, np.array([32], dtype=np.int64), np.empty(1, np.float32), 0, 1, 1
        )
    with pytest.raises(ValueError, match="out: needs 2 items"):
        fused.scan(address, 32, 8, False, index, np.empty(1, np.float32), 0, 1, 1)
    with pytest.raises(ValueError, match="out: needs"):  # float64 items for float32 data
        fused.scan(address, 32, 8, False, index, np.empty(2, np.float64), 0, 1, 1)
    with pytest.raises(ValueError, match="index: needs"):
        fused.scan(address, 32, 8, False, index.astype(np.int32), np.empty(2, np.float32), 0, 1, 1)
    with pytest.raises(ValueError):  # threads
        fused.scan(address, 32, 8, False, None, None, 0, 1, 0)
    with pytest.raises(TypeError):
        fused.scan(address, 32, 8, False, None, None, 0)
    with pytest.raises(ValueError):
        fused.spread(address, 0, False, 0.0)
    # what it accepts: the same numbers as NumPy on the same memory
    out = np.empty(2, np.float32)
    mn, mx, _, _, _ = fused.scan(address, 32, 8, False, index, out, 0, 1, 1)
    assert (mn, mx) == (t.min().item(), t.max().item())
    np.testing.assert_array_equal(out, t.reshape(-1).numpy()[[0, 31]])


def at_odd_byte(t: torch.Tensor, offset: int = 1) -> torch.Tensor:
    """A copy of ``t`` whose memory starts ``offset`` bytes past an aligned address."""
    raw = bytearray(offset) + bytearray(t.contiguous().numpy().tobytes())
    return torch.frombuffer(raw, dtype=t.dtype, offset=offset).view(t.shape)


@needs_kernel
@pytest.mark.parametrize("threads", [1, 3], ids=["1-thread", "rows-split-3-ways"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_tensor_at_an_odd_byte_offset_reads_as_its_aligned_copy(dtype, threads):
    # torch.frombuffer(..., offset=1): every load is misaligned (UBSan flagged the
    # kernel's scalar loads); the kernel reads it by memcpy, to the same numbers
    torch.manual_seed(3)
    aligned = torch.randn(2, 40, 37, dtype=dtype)
    odd = at_odd_byte(aligned)
    assert odd.data_ptr() % odd.element_size() != 0 and torch.equal(odd, aligned)
    got, got_out = scan(odd, positions=True, threads=threads)
    want, want_out = scan(aligned, positions=True, threads=threads)
    assert got == want
    np.testing.assert_array_equal(got_out, want_out)
    mean = aligned.double().mean().item()
    double = dtype == torch.float64
    assert fused.spread(odd.data_ptr(), odd.numel(), double, mean) == fused.spread(
        aligned.data_ptr(), aligned.numel(), double, mean
    )


# -- the evidence a flush encodes in one loop (all_record_fields inlines encode) --


def _decoded(text: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.dtype(dtype).newbyteorder("<"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_a_flushs_evidence_decodes_to_the_gathered_values(dtype, byteorder):
    with_positions = plan_for((2, 300, 8), torch.device("cpu"), True)
    sample_only = plan_for((40, 7), torch.device("cpu"), False)
    rng = np.random.default_rng(0)
    gathered = []
    for plan in (with_positions, sample_only):
        size = plan.host_index.size + plan.bins
        gathered.append(
            (plan, rng.standard_normal(size).astype(np.dtype(dtype).newbyteorder(byteorder)))
        )
    fields = all_record_fields([gathered[0], None, gathered[1]])
    assert fields[1] is None
    name = np.dtype(dtype).name
    for (plan, values), got in zip(gathered, (fields[0], fields[2]), strict=True):
        assert got == record_fields(plan, values)
        n = plan.host_index.size
        assert got["sample"] == {"seed": plan.seed, "dtype": name, "values": encode(values[:n])}
        np.testing.assert_array_equal(_decoded(got["sample"]["values"], name), values[:n])
        if plan.seq_dim is None:
            assert "positions" not in got
        else:
            assert got["positions"]["length"] == 300
            np.testing.assert_array_equal(_decoded(got["positions"]["norms"], name), values[n:])


# -- the finished scan (stats()): the record's stats and evidence fields made in C --


class _TailInPython:
    """The kernel with its finished scan refused: ``StatsBuffer`` then takes the Python tail
    (``_fused_stats`` on the same ``scan()``) and encodes the evidence in Python."""

    def __getattr__(self, name: str):
        return getattr(fused, name)

    @staticmethod
    def stats(*args):
        raise ValueError("refused")


def _buffered(tensors, positions: bool, evidence: bool):
    """Each tensor's (stats, evidence fields) through a StatsBuffer, and which were dicts
    (the finished scan's) before the flush."""
    buf = stats.StatsBuffer(evidence=evidence)
    slots = [buf.add(t, positions=positions)[0] for t in tensors]
    made_in_c = [type(buf._host[s]) is dict for s in slots]
    rows, fields = buf.materialize_with_evidence()
    return [(rows[s], fields[s]) for s in slots], made_in_c


FINISHED = {
    **{
        name: lambda shape=shape, dtype=dtype: torch.randn(shape, dtype=dtype)
        for name, (shape, dtype) in SHAPES.items()
    },
    "three": lambda: torch.tensor([1.0, -2.0, 0.0]),  # 12 bytes of sample: no padding
    "offset": lambda: torch.randn(4, 4096) * 1e-3 + 1e4,  # the spread's second read
    "split": lambda: torch.randn(2, 64, 1024),  # >= FUSED_SPLIT: rows split among threads
    "split_f64": lambda: torch.randn(2, 64, 512, dtype=torch.float64),
}


@needs_kernel
@pytest.mark.parametrize("evidence", ["positions", "sample", "off"])
def test_the_finished_scan_writes_what_the_python_tail_writes(monkeypatch, evidence):
    # every dict and every base64 string equal, byte for byte: records.jsonl is the same
    # whichever of the two made them (base64 of 4, 12, 150, 512, 600 and 1024 bytes: each
    # remainder mod 3)
    torch.manual_seed(0)
    tensors = [make() for make in FINISHED.values()]
    positions, on = evidence == "positions", evidence != "off"
    got, made_in_c = _buffered(tensors, positions, on)
    monkeypatch.setattr(stats, "_fused", _TailInPython())
    want, tail_in_c = _buffered(tensors, positions, on)
    assert all(made_in_c) and not any(tail_in_c)
    for name, (g, w) in zip(FINISHED, zip(got, want, strict=True), strict=True):
        assert g == w, name
        assert json.dumps(g) == json.dumps(w), name  # the same key order too


@needs_kernel
@pytest.mark.parametrize(
    ("values", "answer"),
    [
        pytest.param(lambda: torch.tensor([1.0, float("nan")]), False, id="nan"),
        pytest.param(lambda: torch.tensor([1.0, float("-inf")]), False, id="inf"),
        pytest.param(
            lambda: torch.full((8,), 1e300, dtype=torch.float64), False, id="float64-huge"
        ),
        pytest.param(lambda: torch.full((64,), 1e-40), None, id="subnormal"),
        pytest.param(lambda: torch.zeros(3, 5, 7), None, id="zeros"),
        pytest.param(lambda: torch.full((4,), 3e38), None, id="l2-beyond-float32"),
    ],
)
def test_the_finished_scan_leaves_the_edges_to_python(values, answer, monkeypatch):
    # a sum not finite (a NaN or an Inf, float64 squares beyond range): False, and the
    # passes count them without a second read of the kernel; sums below the smallest
    # normal (all zeros too) or a std/l2 beyond float32's range: None, and the Python tail
    # decides on a read of its own (test_stats_paths.py checks both paths' values)
    t = values()
    plan = plan_for(tuple(t.shape), torch.device("cpu"), False)
    double = t.dtype == torch.float64
    args = (t.data_ptr(), t.numel(), t.shape[-1], double, plan, 1)
    assert fused.stats(*args, stats._TINY[t.dtype], stats._UNIT[t.dtype]) is answer
    tails = []
    tail = stats._fused_stats
    monkeypatch.setattr(stats, "_fused_stats", lambda *a: tails.append(1) or tail(*a))
    buf = stats.StatsBuffer()
    slot, _ = buf.add(t)
    assert type(buf._host[slot]) is tuple and len(tails) == (answer is None)
    assert buf.materialize()[slot]["numel"] == t.numel()


@needs_kernel
def test_the_finished_scan_refuses_what_it_cannot_read():
    t = torch.randn(4, 8)
    address = t.data_ptr()
    with pytest.raises(ValueError, match="multiple of row"):
        fused.stats(address, 32, 5, False, None, 1, 1e-38, 2**-24)
    with pytest.raises(TypeError, match="EvidencePlan"):
        fused.stats(address, 32, 8, False, (1, 2), 1, 1e-38, 2**-24)
    with pytest.raises(TypeError):
        fused.stats(address, 32, 8, False, None, 1)
    with pytest.raises(ValueError):  # threads
        fused.stats(address, 32, 8, False, None, 0, 1e-38, 2**-24)
    shifted = plan_for((40,), torch.device("cpu"), False)  # indices past 32 elements
    with pytest.raises(IndexError):
        fused.stats(address, 32, 8, False, shifted, 1, 1e-38, 2**-24)
