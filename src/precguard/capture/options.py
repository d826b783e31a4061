"""Capture options shared by ``monitor``, ``record`` and ``precision_monitor``."""

from __future__ import annotations

import fnmatch
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

OnNonFinite = Literal["record", "save", "raise"]
ParamPolicy = Literal["first_step", "every_step", "never"]
CaptureLevel = Literal["module", "op", "both"]
OpsAt = Literal["function", "aten"]


class CaptureOptions(BaseModel):
    """What to capture. Unknown options are an error, so a typo is never a silent default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    tensors: bool | list[str] = Field(
        default=False,
        description="Save full tensors: True for every module, or glob patterns on module "
        "names (e.g. ['model.layers.3.*']).",
    )
    backward: bool = Field(
        default=True,
        description="Record gradients of module outputs and of parameters in backward.",
    )
    input_grads: bool = Field(
        default=True,
        description="With backward: also record the gradient w.r.t. each module input that "
        "requires grad (backward.input records), which localizes a module whose backward is "
        "wrong. One tensor hook per input and call; turn off to save that cost.",
    )
    collectives: bool = Field(
        default=True,
        description="Record the inputs and outputs of torch.distributed collectives "
        "(all_reduce, reduce_scatter, all_gather, broadcast, all_to_all) as dist.<op> records "
        "while the recording is open (see docs/distributed.md).",
    )
    evidence: bool = Field(
        default=True,
        description="Keep, besides the statistics, a sample of 128 elements of every floating "
        "tensor and per-position norms of sequence-shaped forward tensors, so a "
        "statistics-only run compared with a full golden can still name the module "
        "(docs/compare.md, 'Evidence in statistics-mode records').",
    )
    kv_cache: bool = Field(
        default=False,
        description="Also record the tensors of a KV cache (a transformers Cache such as "
        "DynamicCache, passed as cache= / past_key_values= or returned) at the module call "
        "that wrote them, as outputs named after the argument (kwargs.cache.layers.1.values); "
        "off by default: each write records the whole cache layer, which grows with the "
        "sequence (docs/capture.md).",
    )
    on_nonfinite: OnNonFinite = Field(
        default="record",
        description="'record': mark and log the origin; 'save': also write the origin's "
        "inputs; 'raise': raise NonFiniteError at the origin.",
    )
    params: ParamPolicy = Field(
        default="first_step",
        description="Record parameter statistics at each module's first call of the first "
        "step, of every step (training), or never.",
    )
    hashes: bool = Field(
        default=False,
        description="Also record a hash of each tensor's bits (16 hex digits, computed on the "
        "device) so two runs that should be bitwise identical are compared by "
        "`precguard bitwise` (see docs/watch.md).",
    )

    level: CaptureLevel = Field(
        default="module",
        description="'module': module hooks only; 'op': every torch op called inside the "
        "model, recorded under its enclosing module as '<module>.op.<name>' "
        "(precguard.capture.ops); 'both': module and op records.",
    )
    ops_at: OpsAt = Field(
        default="function",
        description="With level 'op'/'both': 'function' records the torch functions, F.* and "
        "Tensor methods the model's code calls (TorchFunctionMode); 'aten' the aten ops "
        "dispatched (TorchDispatchMode, after decompositions and autocast casts).",
    )
    ops: list[str] | None = Field(
        default=None,
        description="Glob patterns on op names to record (e.g. ['softmax', 'matmul', "
        "'*norm*']); None records every op except layout and metadata ops (views, "
        "reshape, indexing), which only a pattern that names them records.",
    )
    op_modules: list[str] | None = Field(
        default=None,
        description="Glob patterns on module names whose own ops are recorded (e.g. "
        "['model.layers.*.self_attn']); 'a.b.*' selects a.b and every module below it.",
    )

    def saves(self, module_name: str) -> bool:
        """Return True if full tensors of ``module_name`` are to be saved.

        ``a.b.*`` selects ``a.b`` itself and everything below it.
        """
        if isinstance(self.tensors, bool):
            return self.tensors
        return any(self.saves_pattern(module_name, pat) for pat in self.tensors)

    @staticmethod
    def saves_pattern(module_name: str, pattern: str) -> bool:
        """Return True if the glob ``pattern`` selects ``module_name`` (see :meth:`saves`)."""
        return fnmatch.fnmatchcase(module_name, pattern) or fnmatch.fnmatchcase(
            module_name + ".", pattern
        )
