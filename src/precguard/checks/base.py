"""What a check is, what it returns, and what it gets to work with.

Checks are registered through the ``precguard_register_checks`` plugin hook;
built-in ones the same way as a vendor plugin's. A check is a function
``(ctx, **params) -> Finding | list[Finding]`` wrapped in :class:`Check`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from precguard.report.models import Finding, Status

if TYPE_CHECKING:
    from precguard.backend import Backend
    from precguard.target import Target
    from precguard.target_run import Side


#: the built-in check families, in the order their failures are blamed (the Diagnosis ranks
#: root causes by it): a cause upstream (environment, seeds, data, tokens) explains every
#: numeric symptom downstream of it, and a layer the golden names explains the gradient,
#: loss and reduction-order symptoms after it. The families are open: a plugin adds one by
#: registering a check whose id names it (``npuops.fused_rmsnorm``); a family not listed
#: here ranks after these, since precguard cannot know what it explains.
FAMILIES: tuple[str, ...] = (
    "env",
    "rng",
    "data",
    "tokenizer",
    "norm",
    "rope",
    "attention",
    "ops",
    "amp",
    "fp8",
    "layerwise",
    "grads",
    "loss",
    "reduce",
    "batch",
)
_FAMILY = re.compile(r"[a-z][a-z0-9_]*")


def family_of(check_id: str) -> str:
    """The family of a check id ``family.name``; ValueError unless it has that shape.

    The family is a lowercase identifier; it need not be one of :data:`FAMILIES`
    (a plugin's check may bring its own).

    >>> family_of("rope.position_sweep")
    'rope'
    """
    family, dot, name = check_id.partition(".")
    if not (dot and name and _FAMILY.fullmatch(family)):
        raise ValueError(
            f"expected 'family.name' with a lowercase family such as {', '.join(FAMILIES[:4])}"
        )
    return family


def family_rank(family: str) -> int:
    """Where a family's failures rank as a root cause: :data:`FAMILIES`' order, others last."""
    return FAMILIES.index(family) if family in FAMILIES else len(FAMILIES)


class NotApplicable(Exception):
    """Raise inside a check that cannot apply here; the runner records ``skip`` with the reason.

    >>> raise NotApplicable("target gives no tokenizer")   # doctest: +SKIP
    """


def finding(
    check_id: str,
    status: Status,
    summary: str,
    evidence: dict[str, Any] | None = None,
    remedy: str = "",
) -> Finding:
    """Build a :class:`Finding` with JSON-friendly evidence (floats rounded, tuples as lists).

    A ``pass`` or ``skip`` finding carries no remedy: there is nothing to fix.
    """
    if status in ("pass", "skip"):
        remedy = ""
    return Finding(
        id=check_id, status=status, summary=summary, evidence=_plain(evidence or {}), remedy=remedy
    )


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set):
        return [_plain(v) for v in value]
    if isinstance(value, torch.Tensor):
        return _plain(value.tolist()) if value.numel() <= 64 else f"tensor{list(value.shape)}"
    if isinstance(value, float):
        if math.isfinite(value) and value != 0.0:
            return float(f"{value:.4g}")
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    return value


@dataclass
class CheckContext:
    """What a check runs against. The checklist runner builds it once per run.

    ``backends`` holds the resolved backend of ``device`` and of ``reference``
    (the checklist resolves them, so a device that is unknown or unavailable
    is refused before any check runs); checks reach them through
    :meth:`backend`. Checks never resolve devices themselves.

    ``side`` and ``reference_side`` are the two :class:`~precguard.Side` s the run
    compares (the checks' :class:`~precguard.checks._lab.Lab` opens its models
    through them); ``device``, ``target`` and ``dtype`` are the device side's, spelt
    out for the checks that read them. A context built without sides gets them from
    those fields (the reference in float32).
    """

    device: str
    reference: str = "cpu"
    target: Target | None = None
    golden: Path | None = None
    cache: dict[str, Any] = field(default_factory=dict)
    #: dtype the model's parameters are cast to on the device under test
    #: (``float32`` by default: an ``emu:`` device or autocast lowers the compute dtype)
    dtype: str = "float32"
    #: resolved backends by device string: ``device`` and ``reference``
    backends: Mapping[str, Backend] = field(default_factory=dict)
    #: the device under test as a Side (target, device, dtype, prepare); None without a target
    side: Side | None = None
    #: the reference as a Side: the same target on ``reference`` in float32
    reference_side: Side | None = None

    def __post_init__(self) -> None:
        if self.target is None:
            return
        from precguard.target_run import Side

        if self.side is None:
            self.side = Side(self.target, self.device, self.dtype)
        if self.reference_side is None:
            self.reference_side = Side(self.target, self.reference, torch.float32)

    def backend(self, device: str | None = None) -> Backend:
        """Return the resolved backend of ``device`` (default: the device under test).

        Only the context's own ``device`` and ``reference`` are resolved; asking
        for another device, or building a context without ``backends`` and then
        running a check that needs one, is a LookupError (the check errors).
        """
        wanted = device or self.device
        backend = self.backends.get(wanted)
        if backend is None:
            raise LookupError(
                f"no resolved backend for {wanted!r} in this check context "
                f"(it has: {', '.join(sorted(self.backends)) or 'none'})"
            )
        return backend


CheckFunc = Callable[..., "Finding | list[Finding]"]


@dataclass(frozen=True)
class Check:
    """A registered check: id ``family.name``, a one-line description, the function."""

    id: str
    description: str
    func: CheckFunc
    needs_target: bool = True

    @property
    def family(self) -> str:
        """The part of the id before the first dot."""
        return self.id.split(".", 1)[0]

    def __post_init__(self) -> None:
        try:
            family_of(self.id)
        except ValueError as exc:
            raise ValueError(f"check id {self.id!r}: {exc}") from None
