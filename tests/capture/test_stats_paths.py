"""The fast statistics path records the same numbers as the straightforward one.

The hot path (``StatsBuffer``: a few reductions per CPU tensor read at once, a
reuse cache, one stacked transfer per step on accelerators) is checked
against the definition in docs/capture.md computed the plain way: one torch
op per statistic, each read at once, for every tensor again (std and l2
exactly, in float64).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import precguard
from precguard import PositionNorms
from precguard.capture import stats as stats_module
from precguard.capture.stats import StatsBuffer
from tests.capture.models import Branchy

INTEGER_FIELDS = ("nan", "inf", "zeros", "numel")
FLOAT_FIELDS = ("min", "max", "mean", "std", "absmax", "l2")


def straightforward(t: torch.Tensor) -> dict[str, Any]:
    """Every statistic on its own, as docs/capture.md defines it.

    min, max and the counts come from torch's reductions, the mean from a float64
    sum (a float32 sum of a mask's -3.4e38 entries overflows), std (about that mean)
    and l2 exactly, in float64.
    """
    x = t.detach()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float() if x.is_floating_point() else x.double()
    n = x.numel()
    mn, mx = x.min().item(), x.max().item()
    total = x.sum(dtype=torch.float64).item()
    nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    mean = total / n
    if nan or inf:
        std = torch.std(x, correction=1 if n > 1 else 0).item()
        l2 = torch.linalg.vector_norm(x).item()
    else:
        # exactly (float64, float32 values squared exactly): the spread about the mean, of
        # x / 2^e with max |x| = m 2^e, so that neither subnormal squares underflow nor
        # float64 sums near 1e308 overflow; then times 2^e
        e = math.frexp(max(abs(mn), abs(mx)))[1]
        d = x.double() * 2.0 ** -(e // 2) * 2.0 ** -(e - e // 2)
        mean = ldexp(d.sum().item() / n, e)
        dev = d - d.mean()
        std = ldexp(math.sqrt((dev * dev).sum().item() / (n - 1)), e) if n > 1 else 0.0
        l2 = ldexp(math.sqrt((d * d).sum().item()), e)
        if x.dtype == torch.float32:  # beyond float32's range: inf, as on devices
            limit = torch.finfo(torch.float32).max
            std = math.inf if std > limit else std
            l2 = math.inf if l2 > limit else l2
    return {
        "min": mn,
        "max": mx,
        "mean": mean,
        "std": std,
        "absmax": math.nan if nan else max(abs(mn), abs(mx)),
        "l2": l2,
        "nan": nan,
        "inf": inf,
        "zeros": int((x == 0).sum()),
        "numel": n,
        # a float32 sum in another order (chunks of a large tensor) differs by some
        # unit roundoffs of the sum of |x|
        "mean_abs": x.abs().double().mean().item(),
    }


def ldexp(v: float, e: int) -> float:
    """``v * 2^e``, inf beyond float64's range."""
    try:
        return math.ldexp(v, e)
    except OverflowError:
        return math.copysign(math.inf, v)


class StraightforwardStats(StatsBuffer):
    """A statistics buffer that computes every tensor from scratch, no cache, no batching."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict[str, Any]] = []

    def add_new(
        self, t: torch.Tensor, cache_key: tuple[int, int], need_finite: bool, positions: bool
    ) -> tuple[int, bool | None]:
        # what the recording calls for a tensor the (here always empty) reuse cache lacks
        self.rows.append(straightforward(t))
        return len(self.rows) - 1, self.rows[-1]["nan"] == 0 and self.rows[-1]["inf"] == 0

    def materialize_with_evidence(
        self,
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any] | None]]:
        rows, self.rows = self.rows, []
        return rows, [None] * len(rows)


#: float32's unit roundoff. NumPy's and torch's passes sum the squares by rows of at most
#: 16384 elements (``vector_norm``, ~10 unit roundoffs per row); std's one-pass form is
#: used only where its cancellation at most doubles that: std and l2 within 32 of exact.
#: The compiled kernel sums in float64 and takes the one-pass std only where its
#: worst-case rounding is a quarter unit roundoff: within one of exact.
U32 = 2.0**-24
ROUNDED_FIELDS = {"std": 32 * U32, "l2": 32 * U32}
FUSED_ROUNDED = {"std": U32, "l2": U32}


def assert_same_stats(
    got: dict[str, Any], want: dict[str, Any], where: str, rounded: dict[str, float] | None = None
) -> None:
    rounded = ROUNDED_FIELDS if rounded is None else rounded
    for field in INTEGER_FIELDS:
        assert got[field] == want[field], (where, field)
    for field in FLOAT_FIELDS:
        a, b = got[field], want[field]
        # with a NaN or Inf, torch.std and vector_norm on both sides
        nonfinite = want["nan"] or want["inf"]
        rel = 1e-12 if nonfinite else rounded.get(field, 1e-12)
        # (records read back keep no mean |x|: absmax bounds it)
        scale = want.get("mean_abs", want["absmax"])
        tol = 4 * U32 * scale if field == "mean" and not nonfinite else 0.0
        same = (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=rel, abs_tol=tol)
        assert same, (where, field, a, b)


def record_training(model: nn.Module, step, out, *, reference: bool) -> dict[tuple, Any]:
    """Two training steps under monitor(); return each record's statistics by (step, key)."""
    with precguard.monitor(model, out=out, params="every_step") as handle:
        if reference:
            handle.recording._stats = StraightforwardStats()
        for _ in range(2):
            step()
            model.zero_grad(set_to_none=True)
            handle.step()
    found = {}
    for rec in precguard.load_run(out).records():
        if rec.stats is not None:
            found[(rec.step, rec.key)] = rec.stats.model_dump()
    return found


def test_llama_training_records_the_straightforward_statistics(
    tiny_llama, input_ids, tmp_path, kernel
):
    def step() -> None:
        tiny_llama(input_ids, labels=input_ids).loss.backward()

    fast = record_training(tiny_llama, step, tmp_path / "fast", reference=False)
    plain = record_training(tiny_llama, step, tmp_path / "plain", reference=True)
    assert fast.keys() == plain.keys()
    phases = {key.split(".")[-3] for _, key in fast}
    assert phases == {"forward", "backward"} and len(fast) > 300
    rounded = FUSED_ROUNDED if kernel == "fused" else ROUNDED_FIELDS
    for where, stats in fast.items():
        assert_same_stats(stats, plain[where], str(where), rounded)


def test_hand_written_model_records_the_straightforward_statistics(tmp_path):
    torch.manual_seed(0)
    model = Branchy()
    x = torch.randn(4, 8, requires_grad=True)

    def step() -> None:
        h, d, pair = model(x, scale=0.5)
        (h.sum() + d["b"].square().sum() + pair.aux.mean()).backward()

    fast = record_training(model, step, tmp_path / "fast", reference=False)
    plain = record_training(model, step, tmp_path / "plain", reference=True)
    assert fast.keys() == plain.keys() and fast
    for where, stats in fast.items():
        assert_same_stats(stats, plain[where], str(where))


EDGE_CASES = {
    "randn": lambda: torch.randn(3, 1000),
    "offset": lambda: torch.randn(4096) * 1e-3 + 1e4,
    "bf16": lambda: torch.randn(64, 64).to(torch.bfloat16),
    "int": lambda: torch.randint(-5, 32000, (2, 128)),
    "bool": lambda: torch.rand(50) > 0.5,
    "signed_zeros": lambda: torch.tensor([0.0, -0.0, 1.0, -2.0, 0.0]),
    "nonfinite": lambda: torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0]),
    "only_inf": lambda: torch.tensor([float("inf"), 2.0]),
    "single": lambda: torch.tensor([3.5]),
    "strided": lambda: torch.randn(64, 48).t()[::2],
    "float64": lambda: torch.randn(100, dtype=torch.float64),
    # rows longer than MAX_ROW: split in equal parts, or (a prime length) summed as squares
    "long_rows": lambda: 1.0 + torch.randn(2, 40000),
    "prime_rows": lambda: torch.randn(3, 20011),
    "scalar": lambda: torch.tensor(-2.5),
    "negative_view": lambda: torch._neg_view(torch.randn(8, 8)),  # NumPy refuses it
    "positive": lambda: torch.rand(64, 64) + 0.5,  # min > 0: no zeros, none counted
    # squares beyond float32's range: inf, as the deferred path's float32 gives
    "huge": lambda: torch.tensor([3e38, -3e38, 1.0, 0.0]),
    "mask": lambda: torch.full((4, 8), torch.finfo(torch.float32).min).triu(1),
    # more than two chunks: the passes run chunk by chunk (whole rows), zeros in some
    "chunked": lambda: torch.randn(2, 48, 16000).relu_(),
    "chunked_split_rows": lambda: 1.0 + torch.randn(3, 3, 120000),
    "chunked_nonfinite": lambda: torch.randn(600000).index_fill_(0, torch.tensor([7]), math.nan),
    # |mean| far above the std in float64: the spread as a second read, to float64 rounding
    "float64_offset": lambda: torch.randn(5000, dtype=torch.float64) * 1e-6 + 3.0,
    # rows that are not a multiple of the kernel's 16-element step, and rows over its block
    "ragged_rows": lambda: torch.randn(5, 37) - 0.25,
    "long_blocks": lambda: torch.randn(2, 3, 9001) + 0.5,
    # subnormal values: float32 squares underflow to 0 (l2 was 0 on the passes and the
    # deferred path, 1e-39 on the kernel's); contiguous and strided
    "subnormal": lambda: torch.tensor([1e-45, 1e-44, 1e-42, 1e-40, 1e-39, 0.0, -1e-40] * 3),
    "subnormal_strided": lambda: torch.tensor([1e-45, 3e-42, -1e-40, 1e-39] * 8).view(4, 8).t(),
    "float64_subnormal": lambda: torch.tensor([5e-324, 1e-310, -2e-315, 0.0], dtype=torch.float64),
    # issue 41's: thousands of float64 subnormals over more than one of the kernel's
    # blocks, std ~4.6e-311 and l2 ~7e-309 (both once reported as 0.0)
    "float64_subnormal_many": lambda: torch.rand(5000, dtype=torch.float64) * 1.6e-310 + 0.2e-310,
    # float64 near overflow: sums overflow (mean was inf, std NaN with no NaN counted)
    "float64_near_overflow": lambda: torch.tensor([1e308, -1e308, 1e308, 5.0], dtype=torch.float64),
    "float64_sum_overflows": lambda: torch.tensor([1e308, 1e308, 1.0], dtype=torch.float64),
    # at an odd byte offset: the kernel's loads are unaligned
    "unaligned": lambda: torch.frombuffer(
        bytearray(torch.randn(301).numpy().tobytes()), dtype=torch.float32, offset=1, count=300
    ),
    "zeros": lambda: torch.zeros(3, 7),
}


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request):
    """torch's intra-op threads: one takes NumPy's passes and chunks, more torch's own."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


@pytest.fixture(params=["fused", "passes"])
def kernel(request, monkeypatch):
    """The CPU statistics' two ways: the compiled one-read scan, or (an install without a
    C++ compiler) NumPy's and torch's passes."""
    if request.param == "passes":
        monkeypatch.setattr(stats_module, "_fused", None)
    elif stats_module._fused is None:  # test_fused_kernel.py fails the build for it
        pytest.skip("the one-read kernel is not built")
    return request.param


@pytest.mark.parametrize("name", list(EDGE_CASES))
def test_host_path_equals_the_straightforward_computation(name, threads, kernel):
    torch.manual_seed(0)
    t = EDGE_CASES[name]()
    buf = StatsBuffer()
    slot, finite = buf.add(t)
    want = straightforward(t)
    assert finite == (want["nan"] == 0 and want["inf"] == 0)
    rounded = FUSED_ROUNDED if kernel == "fused" else ROUNDED_FIELDS
    assert_same_stats(buf.materialize()[slot], want, name, rounded)


class Tagged(torch.Tensor):
    """A user's tensor subclass that changes nothing."""


EVIDENCE_SHAPES = {
    "hidden": (2, 40, 24),
    "long_rows": (1, 6, 40000),  # rows split in parts of at most MAX_ROW
    "heads": (2, 3, 300, 16),  # (batch, heads, seq, head_dim), positions binned by 2
    "weight": (48, 20),  # no sequence dimension: the sample only
}


@pytest.mark.parametrize("name", list(EVIDENCE_SHAPES))
def test_host_path_evidence_equals_the_deferred_paths(name, kernel):
    torch.manual_seed(0)
    t = torch.randn(EVIDENCE_SHAPES[name])
    fields = {}
    for defer in (False, True):
        buf = StatsBuffer(defer=defer)
        slot, _ = buf.add(t, positions=True)
        fields[defer] = buf.materialize_with_evidence()[1][slot]
    assert fields[False].keys() == fields[True].keys()
    assert fields[False]["sample"] == fields[True]["sample"]  # the same elements, exactly
    if "positions" in fields[True]:
        host, dev = (PositionNorms(**fields[d]["positions"]) for d in (False, True))
        assert (host.dim, host.bin, host.length) == (dev.dim, dev.bin, dev.length)
        np.testing.assert_allclose(host.array(), dev.array(), rtol=32 * U32)


def test_a_tensor_subclass_records_the_plain_tensors_statistics():
    # a subclass's statistics go through torch's ops (its own dispatch sees them),
    # a plain tensor's through the fast path: the same numbers
    torch.manual_seed(0)
    t = 1.0 + torch.randn(8, 300)
    buf = StatsBuffer()
    plain, sub = buf.add(t)[0], buf.add(t.as_subclass(Tagged).clone())[0]
    got = buf.materialize()
    assert plain != sub
    assert_same_stats(got[sub], straightforward(t), "subclass")
    assert_same_stats(got[plain], straightforward(t), "plain")


def straightforward_deferred(t: torch.Tensor) -> dict[str, Any]:
    """The accelerator definition: var_mean for mean, std and l2, NaN/Inf always counted."""
    x = t.detach()
    if x.dtype not in (torch.float32, torch.float64):
        x = x.float() if x.is_floating_point() else x.double()
    n = x.numel()
    mn, mx = x.min().item(), x.max().item()
    # var_mean of x / 2^(e-1), max |x| = m 2^e (exact scaling), then times 2^(e-1) in
    # float64; beyond x's dtype's range, inf
    absmax = max(abs(mn), abs(mx))
    scale = 2.0 ** (math.frexp(absmax)[1] - 1) if math.isfinite(absmax) and absmax else 1.0
    var, mean = torch.var_mean(x / scale, correction=1 if n > 1 else 0)
    nan, inf = int(torch.isnan(x).sum()), int(torch.isinf(x).sum())
    limit = torch.finfo(x.dtype).max
    l2 = (var * max(n - 1, 1) + mean * mean * n).sqrt().item() * scale
    l2 = math.inf if (inf and not nan) or l2 > limit else l2
    std = var.sqrt().item() * scale
    return {
        "min": mn,
        "max": mx,
        "mean": mean.item() * scale,
        "std": math.inf if std > limit else std,
        "absmax": math.nan if nan else max(abs(mn), abs(mx)),
        "l2": l2,
        "nan": nan,
        "inf": inf,
        "zeros": int((x == 0).sum()),
        "numel": n,
    }


def test_deferred_path_equals_the_straightforward_computation():
    # the accelerator path, run on the CPU: every tensor's statistics stay tensors until
    # one transfer at materialize(); a tensor seen again unchanged reuses its slot
    torch.manual_seed(0)
    tensors = {name: make() for name, make in EDGE_CASES.items()}
    buf = StatsBuffer(defer=True)
    slots = {name: buf.add(t)[0] for name, t in tensors.items()}
    assert buf.add(tensors["randn"]) == (slots["randn"], None)  # unknown without a sync
    assert buf.add(tensors["nonfinite"], need_finite=True) == (slots["nonfinite"], False)
    got = buf.materialize()
    for name, t in tensors.items():
        assert_same_stats(got[slots[name]], straightforward_deferred(t), name)


class Refuses(torch.Tensor):
    """A user's tensor subclass that does not support ``aminmax``."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        if func is torch.aminmax:
            raise NotImplementedError("aminmax is not supported by Refuses")
        return super().__torch_function__(func, types, args, kwargs or {})


class Wrap(nn.Module):
    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h.as_subclass(Refuses)


class WithSubclass(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.wrap = Wrap()
        self.b = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.wrap(self.a(x)).as_subclass(torch.Tensor))


def test_a_failing_statistic_loses_only_its_own_record(tmp_path, caplog):
    torch.manual_seed(0)
    model = WithSubclass()
    x = torch.randn(2, 8)
    with torch.no_grad():
        plain = model(x)
        with (
            caplog.at_level("ERROR", logger="precguard"),
            precguard.monitor(model, out=tmp_path / "run"),
        ):
            watched = [model(x) for _ in range(2)]
    assert all(torch.equal(plain, w) for w in watched)
    failed = [r.precguard_data for r in caplog.records if "hook_failed" in r.getMessage()]
    assert [(f["module"], f["hook"]) for f in failed] == [("wrap", "forward")]
    keys = [(r.step, r.key) for r in precguard.load_run(tmp_path / "run").records()]
    for step in (0, 1):
        assert (step, "b.0.forward.output.0") in keys
        assert (step, "root.0.forward.output.0") in keys
        assert (step, "wrap.0.forward.input.0") in keys  # the call's other records stay
        assert (step, "wrap.0.forward.output.0") not in keys


#: random tensors per probe (a fixed count and seed: the same work on every machine)
PROBES = 60


def random_tensor(rng: np.random.Generator) -> torch.Tensor:
    """A tensor of random layout (offset, strides, transposes) and magnitude: subnormal,
    ordinary, or near the dtype's largest values; some zeros, some constant."""
    dtype = torch.float64 if rng.random() < 0.3 else torch.float32
    info = torch.finfo(dtype)
    dims = int(rng.integers(0, 4))
    shape = tuple(int(s) for s in rng.integers(1, 40, size=dims))
    scale = float(
        rng.choice(
            [
                info.smallest_normal * 2.0**-10,  # subnormal
                1.0,
                info.max / 8 / max(1, math.prod(shape)) ** 0.5,  # sums of squares overflow
                info.max / 16,  # float64: sums overflow; float32: squares beyond its range
            ]
        )
    )
    normal = np.asarray(np.clip(rng.standard_normal(shape), -3.0, 3.0))  # finite times max / 16
    values = torch.from_numpy(normal).to(dtype) * scale
    if rng.random() < 0.3:
        values = values + scale * 2  # |mean| above the std
    if rng.random() < 0.2:
        values[values.abs() < scale * 0.5] = 0.0
    if rng.random() < 0.2 and values.dim() >= 2:
        values = values.transpose(0, -1)  # strided
    elif rng.random() < 0.2 and values.dim() >= 1 and values.shape[0] > 2:
        values = values[::2]  # strided
    elif rng.random() < 0.3:  # at an odd byte offset
        raw = bytearray(1) + bytearray(values.contiguous().numpy().tobytes())
        values = torch.frombuffer(raw, dtype=dtype, offset=1).view(values.shape)
    return values


def test_random_layouts_and_magnitudes_agree_on_every_path(monkeypatch):
    # the kernel, NumPy's and torch's passes, and the deferred (accelerator) path: the
    # same numbers as the straightforward definition, whatever the layout and magnitude
    rng = np.random.default_rng(31)
    tensors = [random_tensor(rng) for _ in range(PROBES)]
    paths = {}
    for name, kernel in (("kernel", True), ("passes", False)):
        if kernel and stats_module._fused is None:
            continue
        with monkeypatch.context() as patch:
            if not kernel:
                patch.setattr(stats_module, "_fused", None)
            buf = StatsBuffer()
            slots = [buf.add(t)[0] for t in tensors]
            got = buf.materialize()
        paths[name] = [got[s] for s in slots]
    buf = StatsBuffer(defer=True)
    slots = [buf.add(t)[0] for t in tensors]
    got = buf.materialize()
    deferred = [got[s] for s in slots]
    for i, t in enumerate(tensors):
        where = f"tensor {i}: {t.dtype} {tuple(t.shape)} stride {t.stride()}"
        want = straightforward(t)
        for name, rows in paths.items():
            rounded = FUSED_ROUNDED if name == "kernel" else ROUNDED_FIELDS
            assert_same_stats(rows[i], want, f"{name} {where}", rounded)
        assert_same_stats(deferred[i], straightforward_deferred(t), f"deferred {where}")
        for field in ("nan", "inf", "zeros"):
            assert deferred[i][field] == want[field], (where, field)
        assert want["nan"] == want["inf"] == 0, where  # finite values: no NaN anywhere
        for row in (deferred[i], *(rows[i] for rows in paths.values())):
            assert not any(math.isnan(row[f]) for f in ("mean", "std", "l2")), where


def test_the_deferred_path_scales_large_tensors_chunk_by_chunk(monkeypatch):
    # the scaled copy var_mean reads is one chunk at a time: the same numbers
    monkeypatch.setattr(stats_module, "DEVICE_CHUNK", 1000)
    torch.manual_seed(0)
    for t in (1.0 + torch.randn(3, 1234), torch.randn(5000, dtype=torch.float64) * 1e300):
        buf = StatsBuffer(defer=True)
        slot, _ = buf.add(t)
        assert_same_stats(buf.materialize()[slot], straightforward(t), f"{t.dtype} chunked")
