"""``layerwise`` checks: record the device under test and compare it with the golden recording.

The golden says what every layer *should* compute; :func:`precguard.compare_runs`
names the first layer that introduced error (not merely passed it on).
"""

from __future__ import annotations

import tempfile
from typing import Any

from precguard.checks._lab import lab
from precguard.checks.base import Check, CheckContext, Finding, NotApplicable, finding


def first_divergence(ctx: CheckContext, profile: str = "default") -> Finding:
    """Record the target on the device like the golden was recorded; compare; name the layer."""
    cid = "layerwise.first_divergence"
    if ctx.golden is None:
        raise NotApplicable("no golden recording given (--golden DIR)")
    try:
        from precguard.compare import compare_recordings
    except ImportError as exc:  # compare is an optional part of some installs
        raise NotApplicable(f"precguard.compare is not available ({exc})") from exc
    from precguard.dump.reader import load_run
    from precguard.runner import record_target

    bench = lab(ctx)
    manifest = load_run(ctx.golden).manifest
    options = manifest.options or {}
    with tempfile.TemporaryDirectory(prefix="precguard-check-") as tmp:
        record_target(
            bench.side,  # the device under test as the user said it, prepare and all
            out=f"{tmp}/actual",
            steps=manifest.steps or 1,
            train=bool(options.get("backward", False)),
            tensors=options.get("tensors", False),
            overwrite=True,
        )
        result = compare_recordings(ctx.golden, f"{tmp}/actual", profile=profile)
    counts = result.counts.model_dump() if hasattr(result.counts, "model_dump") else result.counts
    evidence: dict[str, Any] = {
        "golden": str(ctx.golden),
        "golden_device": manifest.device,
        "verdict": result.verdict,
        "counts": counts,
        "profile": result.profile,
    }
    first = result.first_divergence
    compared = sum(int(counts.get(k, 0)) for k in ("passed", "failed", "nonfinite"))
    if compared == 0:
        # a "match" over zero paired records compared nothing: say so, never pass on it
        return finding(
            cid,
            "warn",
            f"nothing was compared: the golden ({manifest.device}) and this run share no "
            f"record ({counts.get('missing', 0)} unmatched), so the layers cannot be judged",
            evidence,
            "Record the golden from the same target (same model code and module names, same "
            "steps and phases) as the run under test, or map the names with compare's options.",
        )
    if result.verdict == "match" or first is None:
        return finding(
            cid,
            "pass" if result.verdict == "match" else "warn",
            f"{ctx.device} matches the golden recording ({manifest.device}) layer by layer"
            if result.verdict == "match"
            else "the recordings diverge but no single module introduced the error",
            evidence,
        )
    evidence.update(
        {
            "module": first.module,
            "module_type": first.module_type,
            "key": first.key,
            "step": first.step,
            "local": first.local,
            "amplification": first.amplification,
            "reason": first.reason,
            "suspects": [s.module for s in result.suspects][:5],
        }
    )
    how = "introduces" if first.local else "first shows"
    return finding(
        cid,
        "fail",
        f"{first.module} ({first.module_type}) {how} the divergence from the golden at step "
        f"{first.step}: {first.reason}",
        evidence,
        f"Replay that layer on the device with the golden's inputs (`precguard replay "
        f"{ctx.golden} --module {first.module} --target ... --device {ctx.device}`) to confirm "
        "its local error, then look at its norm/RoPE/attention/matmul numerics; the family "
        "findings above often already name the cause.",
    )


CHECKS = [
    Check(
        "layerwise.first_divergence",
        "With --golden: record the device, compare, report the first divergent layer.",
        first_divergence,
    ),
]
