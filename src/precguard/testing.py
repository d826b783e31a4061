"""Precision regression tests: check a model's numbers against a golden recording.

>>> from precguard.testing import assert_matches_golden            # doctest: +SKIP
>>> def test_forward(precguard_golden):                            # doctest: +SKIP
...     assert_matches_golden(build_model(), batch(), precguard_golden)

``pytest --precguard-update-golden`` writes (or refreshes) the goldens instead
of comparing; commit them with the test. See docs/guard.md.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from precguard._logging import get_logger
from precguard.guard import session
from precguard.guard.margin import RecordMargin, margins, worst_margin

if TYPE_CHECKING:
    import torch
    from torch import nn

    from precguard.compare.report import Comparison
    from precguard.guard.golden import GoldenAction

logger = get_logger(__name__)

__all__ = ["GoldenCheck", "assert_matches_golden", "record_model"]

#: the command that refreshes goldens, as failure messages print it
UPDATE_HINT = "pytest --precguard-update-golden"


@dataclass(frozen=True)
class GoldenCheck:
    """What :func:`assert_matches_golden` did (it returns this when it did not raise)."""

    golden: Path
    #: "compared", or what writing the golden did: "new", "refreshed", "unchanged"
    action: str
    #: the run under test, recorded in the test's temporary folder
    recording: Path
    #: the comparison with the golden (None when the golden was written)
    comparison: Comparison | None = None
    #: the record closest to its allowed error (None when nothing was compared)
    worst: RecordMargin | None = None


def assert_matches_golden(
    model: nn.Module,
    inputs: Any,
    golden: str | os.PathLike[str],
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    train: bool = False,
    loss: Callable[[Any], torch.Tensor] | None = None,
    tensors: bool | list[str] = False,
    profile: str | None = None,
    seed: int | None = 0,
    update: bool | None = None,
    workdir: str | os.PathLike[str] | None = None,
) -> GoldenCheck:
    """Record ``model`` on ``inputs`` and assert it matches the golden recording ``golden``.

    The forward pass is recorded (with ``train=True`` a backward pass too) and
    compared with the golden as ``precguard compare`` would: each record judged
    at the less precise side's precision, so a golden recorded on one device
    checks a run on another (a GPU golden in the NPU port's CI). The test fails,
    with an :class:`AssertionError` naming the first divergent module, its error,
    what its precision explains and the path of an HTML report, when the run
    diverges, when it covers only part of the golden (records or phases one
    side lacks: the model changed), or when there is no golden to compare with.

    :param model: the module to run; it is left as it was (moved or cast only on a
        copy, gradients restored after ``train``).
    :param inputs: passed as ``model(x)`` for a tensor, ``model(*t)`` for a tuple,
        ``model(**m)`` for a mapping (the :class:`precguard.Target` convention).
    :param golden: the golden's folder, e.g. the ``precguard_golden`` fixture.
    :param device: device to run on (``cpu``, ``cuda``, ``npu:0``, ``emu:bf16``...);
        default: ``pytest --precguard-device``, else where the model's parameters are.
    :param dtype: dtype to cast the model (and floating inputs) to; default: the
        device's model dtype (a mixed-precision ``emu:`` profile's storage dtype),
        else the model's own.
    :param train: also run backward of ``loss`` and record the gradients.
    :param loss: ``output -> scalar`` for ``train``; default ``output.loss`` when the
        output carries one, else the mean square of the first floating tensor.
    :param tensors: full tensors to keep in the golden (True, or module globs);
        default statistics only, which keeps goldens small.
    :param profile: tolerance profile (``default``, ``strict``, ``msprobe``).
    :param seed: torch is seeded with it before the forward (dropout, random ops),
        and its CPU generator restored afterwards; None leaves the RNG alone.
    :param update: write the golden instead of comparing; default: what
        ``pytest --precguard-update-golden`` says (False outside pytest).
    :param workdir: where the run's recording and the report go; default the
        test's temporary folder (a fresh temporary folder outside pytest).
    :returns: a :class:`GoldenCheck` (the test passed, or the golden was written).
    :raises AssertionError: the run does not match the golden, or there is none.
    """
    __tracebackhide__ = True  # pytest shows the test's line and the message, not our frames
    context = session.current()
    if update is None:
        update = context.update if context is not None else False
    if device is None and context is not None:
        device = context.device
    if workdir is not None:
        work = Path(workdir)
        work.mkdir(parents=True, exist_ok=True)
    elif context is not None:
        work = context.workdir()
    else:
        import tempfile

        work = Path(tempfile.mkdtemp(prefix="precguard-"))
    golden_path = Path(golden)
    recording = record_model(
        model,
        inputs,
        work / "actual",
        device=device,
        dtype=dtype,
        train=train,
        loss=loss,
        tensors=tensors,
        seed=seed,
    )
    if update:
        return _write(golden_path, recording, context)
    return _compare(golden_path, recording, work, profile or "default", context)


def record_model(
    model: nn.Module,
    inputs: Any,
    out: str | os.PathLike[str],
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    train: bool = False,
    loss: Callable[[Any], torch.Tensor] | None = None,
    tensors: bool | list[str] = False,
    seed: int | None = 0,
) -> Path:
    """Record one step of ``model`` on ``inputs`` into ``out`` (a new folder); return it.

    The recording :func:`assert_matches_golden` compares; the parameters are as
    there. ``out`` is refused when it exists and is not empty.
    """
    import torch

    from precguard.capture.api import monitor
    from precguard.capture.options import CaptureOptions
    from precguard.devices import parse_dtype, resolve_backend
    from precguard.target import call_model

    device = device or _device_of(model)
    backend = resolve_backend(device)
    torch_dtype = parse_dtype(dtype) if dtype is not None else backend.model_dtype()
    run_model = _placed(model, backend.torch_device(), torch_dtype)
    batch = _placed_inputs(inputs, backend.torch_device(), torch_dtype)
    compute = backend.compute_dtype()
    options = CaptureOptions(tensors=tensors, backward=train, params="first_step")
    params = list(run_model.parameters())
    grads = [p.grad for p in params]
    rng = torch.random.fork_rng(devices=[]) if seed is not None else contextlib.nullcontext()
    grad_mode = contextlib.nullcontext() if train else torch.no_grad()
    handle = monitor(
        run_model,
        out,
        options,
        device=device,
        auto_step=False,
        compute_dtype=str(compute).removeprefix("torch.") if compute is not None else None,
    )
    try:
        with rng, handle, backend.numerics(), grad_mode:
            if seed is not None:
                backend.manual_seed(seed)
            output = call_model(run_model, batch)
            if train:
                for p in params:
                    p.grad = None
                (loss or default_loss)(output).backward()
            backend.synchronize()
            handle.step()
    finally:
        if train:  # the user's gradients, as they were
            for p, g in zip(params, grads, strict=True):
                p.grad = g
    logger.info("golden_run_recorded", path=str(out), device=device)
    return Path(out)


def default_loss(output: Any) -> torch.Tensor:
    """The loss ``train=True`` uses without ``loss=``: ``output.loss`` when the output
    has one (a Hugging Face model given labels), else the mean square of the first
    floating-point tensor of the output (every element gets a gradient of its own)."""
    import torch

    found = getattr(output, "loss", None)
    if isinstance(found, torch.Tensor):
        return found
    tensor = _first_float(output)
    if tensor is None:
        raise TypeError(
            f"train=True: the model's output ({type(output).__name__}) holds no floating-point "
            "tensor to take a loss of; pass loss="
        )
    return tensor.float().pow(2).mean()


# -- the two modes ---------------------------------------------------------------------


def _write(golden: Path, recording: Path, context: session.TestContext | None) -> GoldenCheck:
    from precguard.guard.golden import write_golden

    action: GoldenAction = write_golden(recording, golden)
    if context is not None:
        context.add(session.Outcome(golden=str(golden), action=action, verdict="written"))
    return GoldenCheck(golden=golden, action=action, recording=recording)


def _compare(
    golden: Path,
    recording: Path,
    work: Path,
    profile: str,
    context: session.TestContext | None,
) -> GoldenCheck:
    __tracebackhide__ = True
    from precguard.compare import compare_runs
    from precguard.compare.options import CompareOptions
    from precguard.errors import PrecguardError

    def fail(verdict: str, message: str, **found: Any) -> AssertionError:
        if context is not None:
            context.add(
                session.Outcome(golden=str(golden), action="compared", verdict=verdict, **found)
            )
        return AssertionError(message)

    if not (golden / "manifest.json").is_file():
        raise fail(
            "no-golden",
            f"no golden recording at {golden}: write it with `{UPDATE_HINT}` and commit it "
            "with the test",
        )
    try:
        result = compare_runs(golden, recording, CompareOptions(profile=profile))
    except PrecguardError as exc:
        raise fail(
            "unusable",
            f"the run cannot be compared with golden {golden}: {exc}\n"
            f"if the model changed on purpose, refresh the golden: {UPDATE_HINT}",
        ) from None
    worst = worst_margin(result)
    found = {
        "worst_margin": worst.margin if worst else None,
        "worst_key": worst.key if worst else None,
        "worst_module": worst.module if worst else None,
    }
    problem = _problem(result, worst)
    if problem is None:
        if context is not None:
            context.add(
                session.Outcome(golden=str(golden), action="compared", verdict="match", **found)
            )
        return GoldenCheck(
            golden=golden, action="compared", recording=recording, comparison=result, worst=worst
        )
    verdict, lines = problem
    from precguard.report.comparison import write_comparison_html

    path = work / "report.html"
    report: Path | None = path
    try:
        write_comparison_html(result, path, golden, recording)
        where = str(path)
    except Exception as exc:  # the verdict stands without its report: say why, fail as due
        logger.warning("golden_report_failed", path=str(path), error=repr(exc))
        where, report = f"not written ({type(exc).__name__}: {exc})", None
    lines += [
        f"HTML report: {where}",
        f"compare it yourself: precguard compare {golden} {recording}",
        f"if the change is intended, refresh the golden: {UPDATE_HINT} (and review the diff)",
    ]
    raise fail(verdict, "\n".join(lines), report=str(report) if report else None, **found)


def _problem(result: Comparison, worst: RecordMargin | None) -> tuple[str, list[str]] | None:
    """Why ``result`` fails a precision test (verdict word, message lines), or None."""
    sides = f"run on {_side(result, 1)} vs golden {result.golden} ({_side(result, 0)})"
    c = result.counts
    compared = c.passed + c.failed + c.nonfinite
    worst_line = (
        f"worst margin {_num(worst.margin)} (error / allowed) at {worst.key}"
        if worst is not None
        else "nothing was compared"
    )
    if result.verdict == "diverged":
        lines = [f"precision regression: {sides} DIVERGED"]
        fd = result.first_divergence
        if fd is not None:
            m = fd.metrics
            level = "statistics" if m.level == "stats" else "full tensors"
            allowed = next((w.allowed for w in margins(result) if w.key == fd.key), None)
            lines.append(
                f"first divergence: {fd.module} ({fd.module_type}), record {fd.key}, "
                f"step {fd.step}, rank {fd.rank}"
            )
            lines.append(
                f"  error {_num(m.error)} ({level}), allowed {_num(allowed)} at {m.dtype}"
                + (
                    f"; {m.dtype} precision explains {_num(fd.expected_error)} given its inputs"
                    if fd.expected_error is not None
                    else ""
                )
            )
            lines.append(f"  {fd.reason}")
        lines.append(f"{c.failed + c.nonfinite} of {compared} compared records fail; {worst_line}")
        return "diverged", lines
    unmatched = result.unmatched.golden_only + result.unmatched.actual_only
    if unmatched:
        shown = ", ".join(unmatched[:5]) + (" ..." if len(unmatched) > 5 else "")
        return "partial", [
            f"precision regression: {sides}: the records differ, the model changed "
            f"({len(result.unmatched.golden_only)} only in the golden, "
            f"{len(result.unmatched.actual_only)} only in the run: {shown})",
            worst_line,
        ]
    if compared == 0:
        return "partial", [f"precision regression: {sides}: nothing was compared"]
    if result.coverage is not None and not result.coverage.complete:
        gaps = "; ".join(result.coverage.gaps) or "part of the recordings was not compared"
        return "partial", [f"precision regression: {sides}: partial match: {gaps}", worst_line]
    return None


def _side(result: Comparison, i: int) -> str:
    device = result.devices[i] if len(result.devices) > i else "?"
    dtype = result.dtypes[i] if len(result.dtypes) > i else None
    return f"{device}, {dtype}" if dtype else device


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:.3g}"


# -- placing the model and its inputs ---------------------------------------------------


def _device_of(model: nn.Module) -> str:
    import itertools

    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return str(first.device) if first is not None else "cpu"


def _placed(model: nn.Module, device: torch.device, dtype: torch.dtype | None) -> nn.Module:
    """``model`` itself when it already is on ``device`` in ``dtype``, else a moved copy."""
    import itertools

    def fits(t: torch.Tensor) -> bool:
        same_device = t.device.type == device.type and (
            device.index is None or t.device.index == device.index
        )
        return same_device and (dtype is None or not t.is_floating_point() or t.dtype == dtype)

    if all(fits(t) for t in itertools.chain(model.parameters(), model.buffers())):
        return model
    return copy.deepcopy(model).to(device=device, dtype=dtype)


def _placed_inputs(inputs: Any, device: torch.device, dtype: torch.dtype | None) -> Any:
    """``inputs`` with every tensor moved to ``device`` (floating ones cast to ``dtype``),
    containers keeping their type (a namedtuple, a ``BatchEncoding``)."""
    from precguard import tree

    def place(t: torch.Tensor) -> torch.Tensor:
        if dtype is not None and t.is_floating_point():
            return t.to(device=device, dtype=dtype)
        return t.to(device)

    return tree.map_tensors(inputs, place)


def _first_float(output: Any) -> torch.Tensor | None:
    import torch

    from precguard import tree

    logits = getattr(output, "logits", None)
    if isinstance(logits, torch.Tensor):
        return logits
    return tree.first_tensor(output)
