"""The replica report: pydantic models written by ``precguard ranks --json``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

RANKS_SCHEMA_VERSION = 1

_FROZEN = ConfigDict(frozen=True, ser_json_inf_nan="strings")


class Disagreement(BaseModel):
    """The first record that replicas (or the ranks of a collective's group) do not share."""

    model_config = _FROZEN

    key: str = Field(description="Record key, the same on every rank.")
    module: str = Field(description="Module (or dist.<op> for a collective).")
    role: str = Field(description="param, or output of a collective.")
    step: int = Field(description="Step.")
    group: list[int] = Field(description="Ranks that must hold the same value.")
    differing_ranks: list[int] = Field(
        description="Ranks outside the majority (on a tie, every rank but the group's lowest)."
    )
    level: Literal["tensor", "stats"] = Field(
        description="'tensor': full tensors compared bit for bit; 'stats': recorded statistics."
    )
    detail: str = Field(description="What differs, e.g. 'l2 1.234 (rank 0) vs 1.235 (rank 1)'.")


class NonFiniteOrigin(BaseModel):
    """The first rank that held a NaN/Inf, and where."""

    model_config = _FROZEN

    rank: int = Field(description="The rank.")
    key: str = Field(description="Its first record with a NaN/Inf.")
    module: str = Field(description="Module of that record.")
    step: int = Field(description="Step.")
    nan: int = Field(description="NaN elements.")
    inf: int = Field(description="Inf elements.")


class Spread(BaseModel):
    """A collective that took NaN/Inf from some ranks' inputs to every rank's output."""

    model_config = _FROZEN

    module: str = Field(description="dist.<op>.")
    op: str = Field(description="The collective.")
    call: int = Field(description="Its call index in the step.")
    step: int = Field(description="Step.")
    group: list[int] = Field(description="Ranks of its process group.")
    from_ranks: list[int] = Field(description="Ranks whose input held NaN/Inf.")
    to_ranks: list[int] = Field(description="Ranks whose output held NaN/Inf.")


class OrderSpread(BaseModel):
    """A reducing collective's output against the spread of the same reduction in other orders."""

    model_config = _FROZEN

    module: str = Field(description="dist.<op>.")
    call: int = Field(description="Call index in the step.")
    step: int = Field(description="Step.")
    orders: int = Field(description="Summation orders tried.")
    order_noise: float = Field(
        description="Largest max-abs difference between two orders, relative to max |exact sum|."
    )
    error: float = Field(
        description="max |recorded output - exact (fp64) sum| relative to max |exact sum|."
    )
    bound_ratio: float = Field(
        description="Largest element of |recorded - exact| / ((n-1) u sum_r |x_r|): the "
        "rounding error bound every summation order of n terms in the dtype (unit roundoff "
        "u) satisfies. Above 1, no order explains the output."
    )
    verdict: Literal["order_noise", "beyond_order_noise"] = Field(
        description="'order_noise': bound_ratio <= 1, the output is a correct sum in some "
        "order; 'beyond_order_noise': it is not the reduction of the recorded inputs."
    )


class RanksReport(BaseModel):
    """What ``precguard ranks`` found in one multi-rank recording."""

    model_config = _FROZEN

    schema_version: int = Field(default=RANKS_SCHEMA_VERSION, description="Format version.")
    run: str = Field(description="The recording directory.")
    world_size: int = Field(description="Ranks in the run (manifest).")
    ranks: list[int] = Field(description="Ranks with records.")
    groups: list[list[int]] = Field(description="Data-parallel replica groups checked.")
    verdict: Literal["agree", "disagree", "inconclusive"] = Field(
        description="'disagree' when replicas differ, a rank held NaN/Inf, or a reduction "
        "is beyond order noise; 'inconclusive' when no record that replicas must share was "
        "found (nothing was compared, so agreement is not shown)."
    )
    compared: int = Field(description="(record, rank) pairs checked against their replicas.")
    steps: int = Field(description="Steps read.")
    first_disagreement: Disagreement | None = Field(default=None, description="See the model.")
    first_nonfinite: NonFiniteOrigin | None = Field(default=None, description="See the model.")
    spread: Spread | None = Field(
        default=None, description="The first collective a NaN/Inf spread through."
    )
    order: list[OrderSpread] = Field(
        default_factory=list,
        description="Reducing collectives whose inputs and outputs were saved as full tensors.",
    )
    incomplete_ranks: list[int] = Field(
        default_factory=list,
        description="Ranks whose status.json does not say they completed (killed, raised, or "
        "no status written).",
    )
    warnings: list[str] = Field(default_factory=list, description="What limits the verdict.")
