"""``loss`` checks: logits against the dtype's range, the loss at init, the CE kernel.

An untrained LM predicts roughly uniformly, so its loss starts near
ln(vocab); far above that the init or the logits' scale is off. The device's
cross-entropy kernel must ignore ``ignore_index`` tokens in both numerator
and denominator and apply label smoothing as torch defines it.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from precguard.checks._lab import NotApplicable, finding, lab, logits_of
from precguard.checks.base import Check, CheckContext, Finding

IGNORE_INDEX = -100


def logits_range(ctx: CheckContext, headroom: float = 16.0) -> Finding:
    """Device logits finite and at least ``headroom``x below the compute dtype's max."""
    bench = lab(ctx)
    cid = "loss.logits_range"
    logits = logits_of(bench.forward(bench.copy("device"), "device")).detach().float().cpu()
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


def cross_entropy(ctx: CheckContext, smoothing: float = 0.1) -> Finding:
    """The device's cross-entropy with ignore_index and label smoothing vs fp64 on real logits."""
    bench = lab(ctx)
    cid = "loss.cross_entropy"
    logits = bench.reference_logits()
    flat = logits.reshape(-1, logits.shape[-1]).float()
    gen = torch.Generator().manual_seed(7)
    labels = torch.randint(0, flat.shape[-1], (flat.shape[0],), generator=gen)
    labels[torch.rand(flat.shape[0], generator=gen) < 0.25] = IGNORE_INDEX
    if (labels == IGNORE_INDEX).all():
        raise NotApplicable("too few logits rows to test")
    cases = {"ignore_index": 0.0, "label_smoothing": smoothing}
    results = {}
    bad = []
    tol = max(1e-5, 8 * bench.eps)
    for case, eps in cases.items():
        x = flat.to(device=bench.dev, dtype=bench.dtype)
        with torch.no_grad(), bench.device.numerics():
            got = float(
                F.cross_entropy(
                    x, labels.to(bench.dev), ignore_index=IGNORE_INDEX, label_smoothing=eps
                )
            )
        want = _reference_ce(flat, labels, eps)
        diluted = want * float((labels != IGNORE_INDEX).float().mean())
        err = abs(got - want) / max(abs(want), 1e-12)
        results[case] = {"device": got, "fp64": want, "rel_error": err}
        if not math.isfinite(got) or err > tol:
            hint = (
                " (ignored tokens counted in the mean)"
                if abs(got - diluted) < abs(got - want)
                else ""
            )
            bad.append(f"{case}: {got:.6g} vs {want:.6g}{hint}")
    evidence = {"tolerance": tol, "ignored_share": 0.25, "cases": results}
    if bad:
        return finding(
            cid,
            "fail",
            f"cross-entropy on {ctx.device} disagrees with fp64: {bad[0]}",
            {**evidence, "failing": bad},
            "Compute the loss in fp32 on the logits (F.cross_entropy(logits.float(), ...)); if "
            "the device kernel mishandles ignore_index or label smoothing, mask the ignored "
            "tokens yourself and divide by their count, or run the loss on the CPU to confirm.",
        )
    return finding(
        cid,
        "pass",
        f"cross-entropy with ignore_index and label smoothing {smoothing:g} matches fp64 "
        f"within {tol:.2g}",
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
        "The device's cross-entropy with ignore_index and label smoothing vs fp64.",
        cross_entropy,
    ),
]
