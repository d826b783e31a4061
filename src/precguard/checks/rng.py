"""``rng`` checks: the same seed must give the same weights, dropout masks and outputs.

Randomness is the first suspect when two runs disagree: an unseeded or
clock-seeded generator makes every later number differ, and a device whose
generator produces another stream under the same seed gives other dropout
masks and another init than the reference.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precguard.capture.hooks import OpsHandle, on_calls, on_ops
from precguard.checks._lab import first_tensor, lab
from precguard.checks.base import Check, CheckContext, Finding, finding
from precguard.checks.fingerprints import tensor_hash
from precguard.devices import seed_everything

_RANDOM_OPS = {
    "rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like",
    "normal", "bernoulli", "multinomial", "poisson", "normal_", "uniform_", "bernoulli_",
    "random_", "exponential_", "geometric_", "cauchy_", "log_normal_", "dropout",
    "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout",
    "native_dropout", "rrelu",
}  # fmt: skip

SEEDING_REMEDY = (
    "Seed every generator from the run's seed, never from the clock: torch.manual_seed(seed) "
    "(seeds the CPU and the registered accelerator), the device's own API where it has one "
    "(torch.cuda.manual_seed_all, torch_npu.npu.manual_seed_all, torch_mlu.mlu.manual_seed_all), "
    "random.seed and numpy.random.seed; a module that needs its own stream should take a "
    "torch.Generator seeded from the run's seed, not time.time()."
)


@dataclass
class RandomCall:
    """One call of a random op seen during a forward pass."""

    op: str
    module: str
    own_generator: bool


@dataclass
class _Tracer:
    calls: list[RandomCall] = field(default_factory=list)

    def op(self, name: str, args: tuple, kwargs: dict, _result: Any, module: str) -> None:
        """Note a random op that drew from a generator, and the module running it."""
        if _consumes(name, args, kwargs):
            gen = kwargs.get("generator")
            self.calls.append(RandomCall(op=name, module=module, own_generator=gen is not None))


def _consumes(name: str, args: tuple, kwargs: dict) -> bool:
    if "dropout" not in name:
        return True
    p = kwargs.get("p", args[1] if len(args) > 1 else 0.5)
    training = kwargs.get("training", args[2] if len(args) > 2 else True)
    return bool(training) and float(p) > 0.0


@contextmanager
def trace_forward(
    model: nn.Module,
) -> Iterator[tuple[_Tracer, list[tuple[str, str]], OpsHandle]]:
    """Trace random ops per module and hash each module's output, in execution order.

    Yields the tracer, the output hashes and the op watcher, which the caller
    enters inside the device's numerics (``Lab.forward(inner=mode)``). The op
    watcher notes each random op and the module running it; the model computes
    exactly as without it.
    """
    tracer = _Tracer()
    outputs: list[tuple[str, str]] = []

    def post(name: str, _m: nn.Module, _a: Any, out: Any) -> None:
        t = first_tensor(out)
        outputs.append((name, tensor_hash(t) if t is not None else "-"))

    # errors raised: a hash or an op that goes unnoted would be a wrong verdict. The op
    # watcher is entered by the caller, inside the device's numerics; removed here.
    ops = on_ops(tracer.op, model=model, ops=_RANDOM_OPS, errors="raise")
    try:
        with on_calls(
            model, post=post, modules=lambda _n, _m: True, with_kwargs=False, errors="raise"
        ):
            yield tracer, outputs, ops
    finally:
        ops.remove()


def _init_hashes(bench: Any, backend: Any) -> dict[str, str]:
    """Build the model fresh (seeded through ``backend``) and hash each tensor; free the model.

    Hashes, not models, are kept, so comparing two builds holds one model at a time.
    """
    model = bench.build_fresh(backend)
    hashes = {k: tensor_hash(v) for k, v in model.state_dict().items()}
    del model
    return hashes


def _device_init_hashes(ctx: CheckContext, bench: Any) -> dict[str, str]:
    """Hashes of one seeded build through the device backend, shared by both rng checks.

    Building a large model costs minutes; ``same_seed`` compares this build with a
    second one and ``cross_device`` with a build through the reference, so one
    device build serves both. The reference side is always built anew.
    """
    key = "rng.device_init_hashes"
    if key not in ctx.cache:
        ctx.cache[key] = _init_hashes(bench, bench.device)
    return ctx.cache[key]


def _param_diff(a: dict[str, str], b: dict[str, str]) -> list[str]:
    return [k for k, h in a.items() if b.get(k) != h]


def _owners(names: list[str]) -> list[str]:
    return sorted({n.rsplit(".", 1)[0] if "." in n else "root" for n in names})


def same_seed(ctx: CheckContext, runs: int = 2) -> Finding:
    """Two runs with the same seed on the device: bitwise-identical init and outputs."""
    bench = lab(ctx)
    cid = "rng.same_seed"
    init_diff = _param_diff(_device_init_hashes(ctx, bench), _init_hashes(bench, bench.device))
    hashes, traces = [], []
    for _ in range(max(2, runs)):
        model = bench.copy("device")
        model.train()
        seed_everything(bench.device, bench.target.seed)
        with trace_forward(model) as (tracer, outputs, mode):
            out = bench.forward(model, "device", inner=mode)
        hashes.append(tensor_hash(first_tensor(out)))
        traces.append((tracer, outputs))
    random_calls = _summarise_calls(traces[0][0].calls)
    evidence: dict[str, Any] = {"output_hashes": hashes, "random_calls": random_calls}
    if init_diff:
        evidence["init_differs"] = init_diff[:10]
        return finding(
            cid,
            "fail",
            f"two builds with seed {bench.target.seed} give different initial weights in "
            f"{', '.join(_owners(init_diff)[:5])}",
            evidence,
            "The model's init draws from an unseeded or clock-seeded generator. " + SEEDING_REMEDY,
        )
    if len(set(hashes)) == 1:
        return finding(
            cid,
            "pass",
            f"{len(hashes)} runs with seed {bench.target.seed} gave bitwise-identical initial "
            "weights and outputs (train mode)",
            evidence,
        )
    culprit = _first_divergent(traces[0][1], traces[1][1])
    suspects = [c for c in traces[0][0].calls if c.module == culprit] if culprit else []
    evidence["first_divergent_module"] = culprit
    where = f" first at module {culprit!r}" if culprit else ""
    if suspects:
        own = any(c.own_generator for c in suspects)
        ops = sorted({c.op for c in suspects})
        evidence["random_ops_in_module"] = ops
        where += f", which calls {', '.join(ops)}" + (
            " with its own torch.Generator (seeded outside the run's seed, e.g. from the clock)"
            if own
            else ""
        )
    return finding(
        cid,
        "fail",
        f"two runs with the same seed differ{where}",
        evidence,
        SEEDING_REMEDY,
    )


def _summarise_calls(calls: list[RandomCall]) -> dict[str, list[str]]:
    summary: dict[str, set[str]] = {}
    for c in calls:
        summary.setdefault(c.module, set()).add(
            c.op + (" (own generator)" if c.own_generator else "")
        )
    return {k: sorted(v) for k, v in summary.items()}


def _first_divergent(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> str | None:
    for (name_a, hash_a), (name_b, hash_b) in zip(a, b, strict=False):
        if name_a != name_b:
            return name_a
        if hash_a != hash_b:
            return name_a
    return None


def cross_device(ctx: CheckContext, numel: int = 4096, p: float = 0.5) -> Finding:
    """Same seed on device and reference: same initial weights and the same dropout masks."""
    bench = lab(ctx)
    cid = "rng.cross_device"
    init_diff = _param_diff(_device_init_hashes(ctx, bench), _init_hashes(bench, bench.reference))
    masks = []
    for backend in (bench.device, bench.reference):
        dev = backend.torch_device()
        ones = torch.ones(numel, device=dev)
        with backend.numerics():
            backend.manual_seed(bench.target.seed)
            masks.append((torch.nn.functional.dropout(ones, p, training=True) != 0).cpu())
    mask_agreement = float((masks[0] == masks[1]).float().mean())
    evidence: dict[str, Any] = {
        "init_params_differing": init_diff[:10],
        "dropout_mask_agreement": mask_agreement,
    }
    consumers: dict[str, list[str]] = {}
    if not init_diff and mask_agreement < 1.0:
        # only a different stream makes it matter whether the forward draws random numbers:
        # the traced train-mode forward runs only then
        model = bench.copy("reference")
        model.train()
        with trace_forward(model) as (tracer, _, mode):
            bench.forward(model, "reference", inner=mode)
        consumers = _summarise_calls(tracer.calls)
        evidence["random_ops_in_forward"] = consumers
    remedy = (
        f"Build and initialise the model on the CPU with torch.manual_seed({bench.target.seed}) "
        "and move it to the device (or load one checkpoint on both); for parity runs turn "
        "dropout off (model.eval() or p=0) or create masks on the CPU with a seeded "
        "torch.Generator and move them. Seed the device with its own API "
        "(torch_npu.npu.manual_seed_all, torch_mlu.mlu.manual_seed_all, "
        "torch.cuda.manual_seed_all)."
    )
    if init_diff:
        return finding(
            cid,
            "fail",
            f"the same seed gives different initial weights on {ctx.device} and {ctx.reference} "
            f"({len(init_diff)} tensors differ)",
            evidence,
            remedy,
        )
    if mask_agreement < 1.0 and consumers:
        return finding(
            cid,
            "fail",
            f"the same seed gives different dropout masks on {ctx.device} and {ctx.reference} "
            f"({mask_agreement:.0%} agree) and the model draws random numbers in "
            f"{', '.join(sorted(consumers)[:4])}",
            evidence,
            remedy,
        )
    if mask_agreement < 1.0:
        return finding(
            cid,
            "pass",
            f"{ctx.device} draws a different random stream than {ctx.reference} under the same "
            "seed, but the model's forward consumes no randomness (keep dropout off in parity "
            "runs)",
            evidence,
        )
    return finding(
        cid,
        "pass",
        f"the same seed gives the same initial weights and dropout masks on {ctx.device} "
        f"and {ctx.reference}",
        evidence,
    )


CHECKS = [
    Check(
        "rng.same_seed",
        "Two same-seed runs on the device give identical init and outputs.",
        same_seed,
    ),
    Check(
        "rng.cross_device",
        "The same seed gives the same init and dropout masks on the device and the reference.",
        cross_device,
    ),
]
