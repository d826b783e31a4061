"""The op graph file: nodes with op type, dtypes, shapes, device and owning module."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from precguard.dump.untrusted import Count

GRAPH_SCHEMA_VERSION = 1

_FROZEN = ConfigDict(frozen=True, extra="forbid")

Source = Literal["torch.export", "op-trace", "recording"]
Level = Literal["function", "aten"]


class TensorMeta(BaseModel):
    """A tensor an op read or wrote: its dtype, shape and device type."""

    model_config = _FROZEN

    dtype: str = Field(description="torch dtype without 'torch.' (float32, bfloat16, int64).")
    shape: list[Count] = Field(description="Tensor shape.")
    device: str | None = Field(default=None, description="Device type; None: the graph's.")


class OpNode(BaseModel):
    """One op call, in execution order."""

    model_config = _FROZEN

    id: Count = Field(description="Position in execution order (0-based).")
    op: str = Field(description="Op name as keys write it: 'softmax', 'matmul', '_softmax'.")
    target: str = Field(
        description="Qualified op: 'torch.nn.functional.softmax', 'Tensor.add', 'aten.mm'."
    )
    module: str = Field(description="The innermost module that called it ('root' at the top).")
    call: Count = Field(default=0, description="0-based count of this op in this module.")
    inputs: list[TensorMeta] = Field(default_factory=list, description="Tensor inputs.")
    outputs: list[TensorMeta] = Field(default_factory=list, description="Tensor outputs.")


class OpGraph(BaseModel):
    """A model's op graph on one device: what ``graph export`` writes and ``graph diff`` reads."""

    model_config = _FROZEN

    schema_version: int = Field(default=GRAPH_SCHEMA_VERSION, description="File format version.")
    kind: Literal["precguard-graph"] = Field(
        default="precguard-graph", description="Tells a graph file from other JSON."
    )
    source: Source = Field(
        description="'torch.export' (the exported program), 'op-trace' (one forward under op "
        "capture) or 'recording' (the op records of a level='op' recording)."
    )
    level: Level = Field(
        description="'aten': dispatched aten ops (torch.export, ops_at='aten'); 'function': "
        "the torch functions and Tensor methods the model's code called."
    )
    device: str = Field(description="Device the graph was taken on (cpu, cuda, emu:bf16, ...).")
    dtype: str | None = Field(default=None, description="The model's parameter dtype.")
    model: str | None = Field(default=None, description="The model's class name.")
    nodes: list[OpNode] = Field(description="Every op call, in execution order.")
