"""The results of comparing (rank, step) units: one pydantic model each, in memory and as JSON.

A worker process (:mod:`precguard.compare.parallel`) sends its share as the JSON
of the :class:`ShardResult` the coordinator merges (never a pickled object).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from precguard.compare.divergence import Candidate
from precguard.compare.padding import LeftOut
from precguard.compare.report import RecordRows
from precguard.dump.schema import Record

_MODEL = ConfigDict(ser_json_inf_nan="strings")
#: what a one-sided record's note needs of it
_WHERE = {"module", "call", "phase", "role", "name", "step"}


class OneSided(BaseModel):
    """An input or output only one side passed or returned in a call both sides recorded.

    An eager attention's ``attention_mask`` that SDPA does not get, a tuple element
    one side returns: not compared with another tensor, told in a note
    (:func:`precguard.compare.hints.one_sided_notes`).
    """

    model_config = _MODEL

    side: str = Field(description="'golden' or 'actual': the side that has it.")
    module: str
    call: int
    phase: str
    role: str
    name: str = Field(description="Where it sat: 'kwargs.attention_mask', 'output.1'.")
    step: int

    @classmethod
    def of(cls, side: str, rec: Record) -> OneSided:
        """The one-sided record ``rec`` of ``side``."""
        return cls(side=side, **rec.model_dump(include=_WHERE))


class UnitResult(BaseModel):
    """The comparison of one (rank, step) unit: what :func:`merge_shards` puts together."""

    model_config = _MODEL

    rank: int
    step: int
    results: RecordRows  # compact rows: memory per record pair stays small
    golden_only: list[str] = Field(default_factory=list, description="Keys only in golden.")
    actual_only: list[str] = Field(default_factory=list, description="Keys only in actual.")
    candidates: list[Candidate] = Field(
        default_factory=list, description="Module calls that made error, in execution order."
    )
    fallback: Candidate | None = Field(
        default=None, description="With no candidate: the first failing record, if any."
    )
    collectives_dropped: tuple[int, int] = Field(
        default=(0, 0),
        description="dist.<op> records (golden, actual) left out: the other side recorded "
        "no collective.",
    )
    one_sided: list[OneSided] = Field(
        default_factory=list,
        description="Inputs/outputs only one side passed or returned (counted missing).",
    )
    left_out: LeftOut = Field(
        default_factory=LeftOut,
        description="Padded positions left out of the metrics (compare/padding.py).",
    )

    @property
    def first(self) -> Candidate | None:
        """The unit's first divergence: its first candidate, else the fallback."""
        return self.candidates[0] if self.candidates else self.fallback


class ShardResult(BaseModel):
    """One process's share: its units in (rank, step) order, its warnings and coverage.

    A share that failed carries the error's class name and message instead
    (:func:`precguard.compare.parallel.raise_carried` raises it again).
    """

    model_config = _MODEL

    units: list[UnitResult] = Field(default_factory=list)
    warnings: dict[int, list[str]] = Field(
        default_factory=dict, description="Per rank, the pairing warnings in the order met."
    )
    compared: set[tuple[int, int]] = Field(default_factory=set)
    phases: set[str] = Field(default_factory=set)
    only_golden: set[str] = Field(default_factory=set)
    only_actual: set[str] = Field(default_factory=set)
    error: str | None = Field(default=None, description="Class name of the error raised.")
    message: str = Field(default="", description="Its message.")
