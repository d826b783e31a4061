"""A cache in the model's dtype: the remedy of a KV-cache finding, verified by decoding again.

While the actual's model takes a step, each cast of a floating tensor to a narrower or
equal dtype other than the model's (``k.half()`` in a bf16 model) is noted; in the cache
the step returns each such cast result is replaced by its source in the model's dtype,
and the decoding is measured again against the golden's, the actual's own cache-free
forward its floor (docs/impact.md says how and why).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from precguard import tree
from precguard._logging import get_logger
from precguard.capture.hooks import on_ops
from precguard.compare.impact_report import RemedyCheck
from precguard.generation.decode import DecodeSide, StepFn, decode
from precguard.localize.impact import relative_error, remedy_check

logger = get_logger(__name__)

#: the tensor methods that change a tensor's dtype (their names, as the op layer reports them)
_CASTS = frozenset({"half", "bfloat16", "float", "to", "type"})


class _CastSources:
    """Notes each cast of a floating tensor to a dtype other than ``dtype`` and no wider
    (the ``post`` callback of :func:`precguard.capture.hooks.on_ops`)."""

    def __init__(self, dtype: torch.dtype) -> None:
        self.dtype = dtype
        self.bits = torch.finfo(dtype).bits
        #: id(cast result) -> (cast result, its source): the result is held so its id stays
        self.sources: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, op: str, args: tuple, kwargs: dict, out: Any, module: str) -> None:
        src = args[0] if args else None
        if (
            isinstance(src, torch.Tensor)
            and isinstance(out, torch.Tensor)
            and out is not src
            and src.is_floating_point()
            and out.is_floating_point()
            and out.dtype not in (src.dtype, self.dtype)
            and torch.finfo(out.dtype).bits <= self.bits
        ):
            self.sources[id(out)] = (out, src)


def cache_in_model_dtype(step: StepFn, dtype: torch.dtype, kept: list[int]) -> StepFn:
    """``step`` with the cache it returns kept in ``dtype`` (module docstring); each call
    appends to ``kept`` how many cache tensors it restored."""

    def kept_step(ids: torch.Tensor, cache: Any, keep: int = 1) -> tuple[torch.Tensor, Any]:
        sources = _CastSources(dtype)
        with on_ops(sources, ops=_CASTS, errors="raise"):
            logits, new_cache = step(ids, cache, keep)
        restored = 0

        def source(t: torch.Tensor) -> torch.Tensor:
            nonlocal restored
            hit = sources.sources.get(id(t))
            if hit is None or hit[0] is not t:
                return t
            restored += 1
            return hit[1].to(dtype)

        # each container keeps its type, and a cache object stays as it is
        new_cache = tree.map_tensors(new_cache, source)
        kept.append(restored)
        return logits, new_cache

    return kept_step


@dataclass
class _KeptSide(DecodeSide):
    """A decoding side whose step keeps its cache in the model's dtype."""

    kept: list[int] | None = None

    def step_fn(self) -> StepFn:
        assert self.kept is not None
        return cache_in_model_dtype(super().step_fn(), self.model_dtype(), self.kept)

    def model_dtype(self) -> torch.dtype:
        """The dtype of the model's floating parameters (its dtype as built)."""
        floating = (p.dtype for p in self.model.parameters() if p.is_floating_point())
        return next(floating, torch.float32)


def verify_cache_remedy(
    golden: DecodeSide,
    actual: DecodeSide,
    prompt: torch.Tensor,
    tokens: list[int],
    *,
    where: str | None = None,
) -> RemedyCheck:
    """The actual's decoding of ``prompt`` (``[1, P]``; ``tokens``: the golden's, fed to both
    sides) with its cache kept in the model's dtype, against the decoding as it is.

    :param where: the cache entry the finding names (``layers.0.values``), for the summary.
    """
    steps = len(tokens)
    forced = list(tokens)
    expected = decode(golden, prompt, steps, forced=forced, cache_free=False).scores
    as_is = decode(actual, prompt, steps, forced=forced, cache_free=True)
    before = relative_error(as_is.scores, expected)
    floor = None if as_is.free_scores is None else relative_error(as_is.free_scores, expected)
    kept: list[int] = []
    side = _KeptSide(**{f: getattr(actual, f) for f in DecodeSide.__dataclass_fields__}, kept=kept)
    summary = "the KV cache kept in the model's dtype" + (f" ({where})" if where else "")
    summary += f" ({side.model_dtype()})".replace("torch.", "")
    after = relative_error(
        decode(side, prompt, steps, forced=forced, cache_free=False).scores, expected
    )
    note = "the decoding's logits over every step, the golden's tokens fed to both sides"
    check = remedy_check("cache-model-dtype", summary, before, after, floor, note)
    if not any(kept):
        check = check.model_copy(
            update={
                "note": "no cache tensor was a cast to another dtype (an HF Cache object, or a "
                "cache stored in the model's dtype already): nothing to keep"
            }
        )
    logger.info("cache_remedy_verified", verdict=check.verdict, restored=sum(kept))
    return check
