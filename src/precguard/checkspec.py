"""What a plugin registers as a check, and what a check returns: the checks' contract.

The hook specifications (:mod:`precguard.hookspecs`) name these types, so they live
below the plugin registry and import nothing of precguard: a check registered by a
plugin is a :class:`Check` (id ``family.name``, a description, the function), and what
its function returns is one :class:`Finding` or a list of them. The context a check runs
against and the helpers that build findings are in :mod:`precguard.checks.base`, which
re-exports these; :mod:`precguard.report.models` builds the Diagnosis from findings.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["pass", "warn", "fail", "skip", "error"]


class Finding(BaseModel):
    """One result of one check."""

    model_config = ConfigDict(frozen=True, extra="forbid", ser_json_inf_nan="strings")

    id: str = Field(description="Check id, 'family.name'.")
    status: Status = Field(description="pass, warn, fail, skip (not applicable) or error.")
    summary: str = Field(description="One sentence: what was found.")
    evidence: dict[str, Any] = Field(
        default_factory=dict, description="Numbers, module names, file paths behind the finding."
    )
    remedy: str = Field(default="", description="What to change, concretely.")

    @property
    def family(self) -> str:
        """The part of the id before the first dot."""
        return self.id.split(".", 1)[0]


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


CheckFunc = Callable[..., Finding | list[Finding]]


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
