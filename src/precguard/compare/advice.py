"""The one source of advice: a local finding's candidate remedies, and the one chosen.

compare's why line, ``--verify`` (localize/verify.py), ``check --verify`` and
``op-check --verify`` all take a finding's remedies from :func:`candidates`, the
smallest change first (the one to apply when it works: keeping ``inv_freq`` in float32
fixes a cast HF LLaMA, not rotary angles computed in bf16, and the recordings cannot
tell the two apart). ``--verify`` tries them in that order and :func:`chosen` picks the
one it reports, so the advice printed without a re-run is never one a re-run could refute.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import suppress

from pydantic import BaseModel, ConfigDict, Field

from precguard.compare.impact_report import RemedyCheck


class Advice(BaseModel):
    """One candidate remedy of a local finding, in the user's words."""

    model_config = ConfigDict(frozen=True)

    remedy: str = Field(
        description="The remedy id --verify applies: float32-buffers, float32-compute, "
        "reference-precision (docs/impact.md)."
    )
    text: str = Field(description="What to change, in the user's words.")


def kind(module_type: str) -> str:
    """``loss``, ``norm``, ``rotary`` or ``module``: which float32 remedy fits a module class."""
    name = module_type.lower()
    for found, words in (("loss", ("loss",)), ("norm", ("norm",)), ("rotary", ("rotary", "rope"))):
        if any(w in name for w in words):
            return found
    return "module"


def compute_text(module: str, module_type: str) -> str:
    """The float32-compute remedy of a module class, in the user's words."""
    return {
        "norm": "compute the norm's statistics in float32",
        "rotary": "compute the rotary frequencies and angles in float32",
        "loss": "compute the loss on float32 logits",
        "module": f"compute {module} in float32 (inputs upcast, output rounded back)",
    }[kind(module_type)]


def buffers_text(names: Iterable[str], golden_dtype: str, actual_dtype: str) -> str:
    """The float32-buffers remedy: keep the buffers a cast rounded at their built dtype."""
    names = list(names)
    listed = ", ".join(f"`{n}`" for n in names)
    it = "them" if len(names) > 1 else "it"
    return (
        f"keep {listed} in {golden_dtype} (model.to({actual_dtype}) casts float buffers "
        f"too: cast {it} back after the cast, or recompute {it} in {golden_dtype})"
    )


def candidates(
    module: str,
    module_type: str,
    cast_buffers: Mapping[str, tuple[str, str]] | None = None,
    *,
    reference_dtype: str = "float32",
) -> list[Advice]:
    """The remedies of a local finding at ``module``, in the order ``--verify`` tries them.

    ``cast_buffers``: the module's buffers a cast rounded, ``{name: (golden dtype,
    actual dtype)}`` (``inv_freq``). The smallest change comes first: those buffers
    kept, then the module's arithmetic in float32, then the whole module at reference
    precision (``reference_dtype``).

    >>> cast = {"inv_freq": ("float32", "bfloat16")}
    >>> [a.remedy for a in candidates("m.rope", "RotaryEmbedding", cast)]
    ['float32-buffers', 'float32-compute', 'reference-precision']
    """
    found: list[Advice] = []
    if cast_buffers:
        text = buffers_text(cast_buffers, *next(iter(cast_buffers.values())))
        found.append(Advice(remedy="float32-buffers", text=text))
    compute = compute_text(module, module_type)
    if kind(module_type) == "loss":
        return [*found, Advice(remedy="float32-loss", text=compute)]
    reference = f"run {module} at reference precision ({reference_dtype})"
    found.append(Advice(remedy="float32-compute", text=compute))
    found.append(Advice(remedy="reference-precision", text=reference))
    return found


#: the order of :func:`candidates`, by remedy id (a plugin's switch comes after)
ORDER = ("float32-buffers", "float32-loss", "float32-compute", "reference-precision")


def ordered(checks: Sequence[RemedyCheck]) -> list[RemedyCheck]:
    """``checks`` in the order of :func:`candidates` (switches, unknown ids last)."""
    rank = {r: i for i, r in enumerate(ORDER)}
    return sorted(checks, key=lambda c: rank.get(c.remedy, len(ORDER)))


def chosen(checks: Sequence[RemedyCheck]) -> RemedyCheck | None:
    """The remedy verification chose: the first verified in :func:`candidates`' order,
    else the partial one that left the smallest error; None when none helped (or none
    was needed)."""
    checks = ordered(checks)
    verified = [c for c in checks if c.verdict == "verified"]
    partial = [c for c in checks if c.verdict == "partial" and c.after is not None]
    return verified[0] if verified else min(partial, key=lambda c: c.after or 0.0, default=None)


def listed(advice: Sequence[Advice]) -> str:
    """The candidates as one phrase: ``try in order: 1) ...; 2) ...``."""
    if len(advice) == 1:
        return advice[0].text
    return "try in order: " + "; ".join(f"{i}) {a.text}" for i, a in enumerate(advice, 1))


#: devices a comparison's golden is usually recorded on: the trusted reference
_REFERENCE_DEVICES = ("cpu", "cuda")


def swapped_sides(devices: Sequence[str], dtypes: Sequence[str | None]) -> str | None:
    """One line when the golden looks like the run under test (its dtype less precise
    than the actual's, or its device not the CPU or CUDA where the actual's is), whose
    advice would come out inverted; None when the order looks right."""
    from precguard.numerics import unit_roundoff

    g_dev, a_dev = [*devices, "", ""][:2]
    g_dt, a_dt = [*dtypes, None, None][:2]
    why = ""
    with suppress(KeyError, ValueError):  # a dtype without a unit roundoff
        if g_dt and a_dt and unit_roundoff(g_dt) > unit_roundoff(a_dt):
            why = f"the golden is in {g_dt}, less precise than the actual's {a_dt}"
    reference = [d.split(":")[0] in _REFERENCE_DEVICES for d in (g_dev, a_dev)]
    if not why and g_dev and a_dev and reference == [False, True]:
        why = f"the golden ran on {g_dev}, the actual on the reference device {a_dev}"
    if not why:
        return None
    return f"the sides look swapped: {why}; compare takes GOLDEN first, then ACTUAL"
