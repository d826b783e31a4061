"""``loss`` checks: logits against the dtype's range, the loss at init, the CE kernel.

An untrained LM predicts roughly uniformly, so its loss starts near
ln(vocab); far above that the init or the logits' scale is off. The device's
cross-entropy kernel must ignore ``ignore_index`` tokens in both numerator
and denominator; the target's own loss is what is judged, against the fp64
oracle, so a model is never failed for a feature (label smoothing) it does
not use.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F

from precguard.checks._lab import Lab, flatten, lab, logits_of, loss_of
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding
from precguard.devices import dtype_name
from precguard.numerics import opcheck_tolerance
from precguard.opcheck.measure import probe_compute_dtype
from precguard.oracle import map_tensors_keeping_types, run_in_fp64

IGNORE_INDEX = -100


def logits_range(ctx: CheckContext, headroom: float = 16.0) -> Finding:
    """Device logits finite and at least ``headroom``x below the compute dtype's max."""
    bench = lab(ctx)
    cid = "loss.logits_range"
    logits = logits_of(bench.output("device")).detach().float().cpu()
    limit = float(torch.finfo(bench.compute_dtype).max)
    nonfinite = int((~torch.isfinite(logits)).sum())
    absmax = float(torch.nan_to_num(logits, nan=0.0, posinf=0.0, neginf=0.0).abs().max())
    ref_absmax = float(bench.reference_logits().abs().max())
    evidence = {
        "compute_dtype": bench.compute_dtype,
        "device_absmax": absmax,
        "reference_absmax": ref_absmax,
        "dtype_max": limit,
        "nonfinite": nonfinite,
    }
    remedy = (
        "Compute the LM head and the loss in fp32 (`logits = lm_head(h).float()`), keep "
        "logit soft-capping/temperature in fp32, and check the final norm before the head."
    )
    if nonfinite:
        return finding(
            cid, "fail", f"{nonfinite} logits are NaN/Inf on {ctx.device}", evidence, remedy
        )
    if absmax > limit / headroom:
        return finding(
            cid,
            "fail",
            f"logits reach {absmax:.3g}, within {headroom:g}x of {bench.cname}'s max",
            evidence,
            remedy,
        )
    return finding(
        cid,
        "pass",
        f"logits peak at {absmax:.3g} on {ctx.device}, far below {bench.cname}'s max",
        evidence,
    )


def init_value(ctx: CheckContext, max_gap: float = 0.02) -> Finding:
    """Loss on device vs reference (relative gap), and the reference loss vs ln(vocab)."""
    bench = lab(ctx)
    cid = "loss.init_value"
    ref_loss = bench.gradients("reference").loss
    dev_loss = bench.gradients("device").loss
    vocab = bench.reference_logits().shape[-1]
    uniform = math.log(vocab)
    gap = abs(dev_loss - ref_loss) / max(abs(ref_loss), 1e-12)
    warn_gap = max(1e-4, 2 * bench.eps)
    evidence = {
        "reference_loss": ref_loss,
        "device_loss": dev_loss,
        "relative_gap": gap,
        "ln_vocab": uniform,
        "vocab": vocab,
        "fail_above": max_gap,
        "warn_above": warn_gap,
    }
    if not math.isfinite(dev_loss):
        return finding(cid, "fail", f"the loss on {ctx.device} is {dev_loss}", evidence)
    if gap > max_gap:
        return finding(
            cid,
            "fail",
            f"the loss on {ctx.device} ({dev_loss:.5g}) differs from the reference "
            f"({ref_loss:.5g}) by {gap:.2%}",
            evidence,
            "Run the other checks of this list for the cause; a gap above ~2% is beyond what "
            "precision alone explains for the same weights and batch.",
        )
    if ref_loss > 1.5 * uniform:
        return finding(
            cid,
            "warn",
            f"the loss at init is {ref_loss:.4g}, well above ln(vocab) = {uniform:.4g}: the "
            "init or the logits' scale is too large (or the labels are misaligned)",
            evidence,
            "An untrained LM should start near ln(vocab): check the init std of the LM head, "
            "label shifting, and that padding tokens are ignored in the loss.",
        )
    if gap > warn_gap:
        return finding(
            cid,
            "warn",
            f"the loss differs from the reference by {gap:.2%} (above {warn_gap:.2g})",
            evidence,
        )
    note = (
        f"near ln(vocab) = {uniform:.4g} as expected at init"
        if abs(ref_loss - uniform) < 0.25 * uniform
        else f"below ln(vocab) = {uniform:.4g} (a trained model)"
    )
    return finding(
        cid,
        "pass",
        f"loss {dev_loss:.5g} on {ctx.device} vs {ref_loss:.5g} on the reference "
        f"({gap:.2%}); {note}",
        evidence,
    )


def _reference_ce(logits: torch.Tensor, labels: torch.Tensor, smoothing: float) -> float:
    x = logits.double()
    keep = labels != IGNORE_INDEX
    logp = torch.log_softmax(x[keep], dim=-1)
    nll = -logp.gather(-1, labels[keep][:, None]).squeeze(-1)
    smooth = -logp.mean(-1)
    return float(((1 - smoothing) * nll + smoothing * smooth).mean())


def _label_tensor(batch: Any) -> tuple[str, torch.Tensor] | None:
    """Where a batch keeps its labels: ``labels``, ``input_ids``, or its 2-D integer tensor."""
    items = [(p, t) for p, t in flatten(batch) if isinstance(t, torch.Tensor)]
    for want in (".labels", ".input_ids"):
        for path, t in items:
            if path.endswith(want) and not t.is_floating_point():
                return path, t
    for path, t in items:
        if t.dim() == 2 and not t.is_floating_point() and t.dtype != torch.bool:
            return path, t
    return None


def _with_ignored(batch: Any, labels: torch.Tensor, share: float) -> Any:
    """``batch`` with ``share`` of ``labels`` (the tensor object itself) set to ignore_index."""
    gen = torch.Generator().manual_seed(7)
    ignored = labels.clone()
    ignored[torch.rand(labels.shape, generator=gen) < share] = IGNORE_INDEX
    return map_tensors_keeping_types(batch, lambda t: ignored if t is labels else t)


def _target_loss_cases(bench: Lab) -> dict[str, dict[str, float] | str]:
    """The target's own loss on the reference output: device vs the fp64 oracle, per case.

    Cases: the batch as the target gives it, and with 25% of its labels set to
    ignore_index when the loss accepts that (else a string says it does not).
    The same output goes into both sides, so only the loss itself is judged.
    """
    loss_fn = bench.target.loss
    assert loss_fn is not None
    # the reference output rounded to the device's dtype: both sides get the same numbers
    output = map_tensors_keeping_types(
        bench.output("reference"),
        lambda t: t.detach().cpu().to(bench.dtype) if t.is_floating_point() else t.detach().cpu(),
    )
    batch = bench.batch(0)
    cases: dict[str, Any] = {"target_batch": batch}
    found = _label_tensor(batch)
    if found is not None:
        cases["ignore_index"] = _with_ignored(batch, found[1], 0.25)
    results: dict[str, dict[str, float] | str] = {}
    for case, b in cases.items():
        try:
            want = float(run_in_fp64(loss_fn, output, b))
        except Exception as exc:
            if case == "target_batch":
                raise
            results[case] = f"not used by the target's loss ({type(exc).__name__})"
            continue
        dev_out = map_tensors_keeping_types(output, lambda t: _to_device(bench, t))
        dev_batch = bench.place(b, "device")
        with torch.no_grad(), bench.device.numerics():
            got = float(loss_fn(dev_out, dev_batch))
        err = abs(got - want) / max(abs(want), 1e-12) if math.isfinite(got) else math.inf
        results[case] = {"device": got, "fp64": want, "rel_error": err}
    return results


def _model_loss_case(bench: Lab) -> dict[str, Any] | None:
    """The loss the model computes inside ``forward`` on the device, vs fp64 on its own logits.

    None when the model returns no loss of its own (``.loss``, a ``(loss, logits)``
    tuple) or the batch has no labels. The fp64 cross-entropy is taken on the
    *device's* logits, so only the loss computation is judged; labels are read
    shifted by one (a causal LM, HF's convention) or as they are, whichever
    explains the model's loss (the other is named in the evidence). The tolerance
    is op-check's (:func:`~precguard.numerics.opcheck_tolerance`) at the
    precision the device computes **float32** arithmetic in, ``N`` the number of
    tokens: a loss upcast to fp32 as it should be is held to fp32's error, one
    left in bf16 is not; on a device that computes fp32 ops in bf16 anyway
    (``emu:bf16``) a correct loss is rounded to bf16 too and the tolerance is bf16's.
    """
    found = _label_tensor(bench.batch(0))
    if found is None:
        return None
    output = bench.output("device")
    loss = loss_of(output)
    if loss is None:
        return None
    got = float(loss.detach().float().cpu())
    logits = logits_of(output).detach().to("cpu", torch.float64)
    labels = found[1].detach().cpu()
    if logits.dim() < 2 or tuple(logits.shape[:-1]) != tuple(labels.shape):
        return None
    vocab = logits.shape[-1]
    conventions = {
        "shifted": (logits[..., :-1, :], labels[..., 1:]),
        "as given": (logits, labels),
    }
    wants: dict[str, float] = {}
    for name, (lg, lb) in conventions.items():
        lb = lb.reshape(-1)
        if lb.numel() and bool((lb != IGNORE_INDEX).any()):
            keep = lb[lb != IGNORE_INDEX]
            if bool(((keep >= 0) & (keep < vocab)).all()):
                wants[name] = float(
                    F.cross_entropy(lg.reshape(-1, vocab), lb, ignore_index=IGNORE_INDEX)
                )
    if not wants:
        return None
    convention = min(wants, key=lambda k: abs(got - wants[k]))
    want = wants[convention]
    tokens = int((conventions[convention][1] != IGNORE_INDEX).sum())
    fp32_ops = probe_compute_dtype(bench.device)
    tol = opcheck_tolerance(dtype_name(fp32_ops), tokens)
    err = abs(got - want) / max(abs(want), 1e-12) if math.isfinite(got) else math.inf
    return {
        "device": got,
        "fp64_on_device_logits": want,
        "rel_error": err,
        "labels": convention,
        "tokens": tokens,
        "float32_ops_computed_in": dtype_name(fp32_ops),
        "tolerance": tol,
    }


def _to_device(bench: Lab, t: torch.Tensor) -> torch.Tensor:
    t = t.detach().to(bench.dev)
    return t.to(bench.dtype) if t.is_floating_point() else t


def cross_entropy(ctx: CheckContext, smoothing: float | None = None) -> Finding:
    """The loss the target computes, on the device vs the fp64 oracle, on the model's own logits.

    With a ``loss`` on the target: that function, on the batch as given and with
    25% of its labels ignored (``ignore_index=-100``) when it accepts them.
    Without one: ``F.cross_entropy`` with ignored labels. Label smoothing is
    tested only when the checklist asks for it (``smoothing``): a model that does
    not use it must not fail for it.
    """
    bench = lab(ctx)
    cid = "loss.cross_entropy"
    tol = max(1e-5, 8 * bench.eps)
    results: dict[str, Any] = {}
    tolerances: dict[str, float] = {}
    own = _model_loss_case(bench)
    if own is not None:
        results["model_loss"] = own
        tolerances["model_loss"] = own["tolerance"]
    if bench.target.loss is not None:
        measured = _target_loss_cases(bench)
        results["target_loss"] = measured
        errors = {k: v["rel_error"] for k, v in measured.items() if isinstance(v, dict)}
        subject = "the target's loss"
    else:
        errors = {}
        subject = "F.cross_entropy"
    kernel_cases = {} if bench.target.loss is not None else {"ignore_index": 0.0}
    if smoothing:
        kernel_cases["label_smoothing"] = smoothing
    if kernel_cases:
        logits = bench.reference_logits()
        flat = logits.reshape(-1, logits.shape[-1]).float()
        gen = torch.Generator().manual_seed(7)
        labels = torch.randint(0, flat.shape[-1], (flat.shape[0],), generator=gen)
        labels[torch.rand(flat.shape[0], generator=gen) < 0.25] = IGNORE_INDEX
        if (labels == IGNORE_INDEX).all():
            raise NotApplicable("too few logits rows to test")
        for case, eps in kernel_cases.items():
            x = flat.to(device=bench.dev, dtype=bench.dtype)
            with torch.no_grad(), bench.device.numerics():
                got = float(
                    F.cross_entropy(
                        x, labels.to(bench.dev), ignore_index=IGNORE_INDEX, label_smoothing=eps
                    )
                )
            want = _reference_ce(flat, labels, eps)
            diluted = want * float((labels != IGNORE_INDEX).float().mean())
            err = abs(got - want) / max(abs(want), 1e-12) if math.isfinite(got) else math.inf
            results[f"F.cross_entropy:{case}"] = {"device": got, "fp64": want, "rel_error": err}
            errors[f"F.cross_entropy:{case}"] = err
            if err > tol and abs(got - diluted) < abs(got - want):
                results[f"F.cross_entropy:{case}"]["hint"] = "ignored tokens counted in the mean"
    if own is not None:
        errors["model_loss"] = own["rel_error"]
    bad = {k: v for k, v in errors.items() if not v <= tolerances.get(k, tol)}
    evidence = {"tolerance": tol, "cases": results}
    if "model_loss" in bad:
        return finding(
            cid,
            "fail",
            f"the loss the model computes in forward on {ctx.device} ({own['device']:.6g}) "
            "differs from cross-entropy in fp64 on its own logits "
            f"({own['fp64_on_device_logits']:.6g}) "
            f"by {own['rel_error']:.3g} (relative), above the {own['tolerance']:.2g} that "
            f"{own['float32_ops_computed_in']} arithmetic explains: the loss is computed in "
            "lower precision than its float32 logits",
            {
                **evidence,
                "tolerance": own["tolerance"],
                "target_loss_tolerance": tol,
                "failing": sorted(bad),
            },
            "Compute the loss on float32 logits (F.cross_entropy(logits.float(), labels)); a "
            "hand-written log-softmax (logits - logsumexp) in bf16/fp16 cancels on peaked "
            "logits.",
        )
    if bad:
        case, err = max(bad.items(), key=lambda kv: kv[1])
        return finding(
            cid,
            "fail",
            f"{subject} on {ctx.device} disagrees with fp64 by {err:.3g} (relative) on "
            f"{case.replace('_', ' ')}",
            {**evidence, "failing": sorted(bad)},
            "Compute the loss in fp32 on the logits (F.cross_entropy(logits.float(), ...)); if "
            "the device kernel mishandles ignore_index or label smoothing, mask the ignored "
            "tokens yourself and divide by their count, or run the loss on the CPU to confirm.",
        )
    tested = ", ".join(k.replace("_", " ") for k in errors)
    if own is not None:
        subject = f"the model's own loss (within {own['tolerance']:.2g}) and {subject}"
    return finding(
        cid,
        "pass",
        f"{subject} matches fp64 within {tol:.2g} on {ctx.device} ({tested})",
        evidence,
    )


CHECKS = [
    Check(
        "loss.logits_range", "Device logits finite and well below the dtype's max.", logits_range
    ),
    Check(
        "loss.init_value",
        "Loss on device vs reference (relative gap), and vs ln(vocab) at init.",
        init_value,
    ),
    Check(
        "loss.cross_entropy",
        "The target's loss (or F.cross_entropy) on the device vs the fp64 oracle, with "
        "ignored labels.",
        cross_entropy,
    ),
]
