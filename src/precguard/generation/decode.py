"""Decoding with a KV cache on one side: the model, its device, and a step callable.

A model is driven one of three ways: an HF ``generate``-capable model with a
``DynamicCache``; a module whose ``forward`` is ``step(input_ids, cache) -> (logits,
cache)`` (``cache=None`` for the prefill, docs/generate.md shows one); a module whose
``forward(input_ids)`` returns logits and keeps no cache (each step runs the whole
sequence again, and there is no cache to compare).
"""

from __future__ import annotations

import contextlib
import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from precguard.backend import Backend, capture_scope
from precguard.devices import dtype_name
from precguard.errors import TargetError
from precguard.target import Target, raised
from precguard.target_run import Side

#: ``step(input_ids, cache, keep=1) -> (logits, cache)``; ``keep``: how many last positions'
#: logits are needed (a hint: a plain step module may return them all)
StepFn = Callable[..., tuple[torch.Tensor, Any]]


@dataclass
class DecodeSide:
    """A built model on its device, ready to decode."""

    device: str
    backend: Backend
    model: nn.Module
    dtype: str
    compute_dtype: str
    target: Target

    @classmethod
    def build(
        cls,
        target: Target,
        device: str,
        dtype: str | None = None,
        prepare: Callable[[nn.Module], Any] | None = None,
    ) -> DecodeSide:
        """Build ``target``'s model on ``device`` as ``precguard record`` does (seeded)."""
        return cls.open(Side(target, device, dtype, prepare))

    @classmethod
    def open(cls, side: Side) -> DecodeSide:
        """Set ``side`` up (:meth:`Side.open`), build its model (seeded), prepare it, eval."""
        run = side.open()
        model = run.prepared(run.build_model())
        model.eval()
        compute = run.backend.compute_dtype()
        compute_name = str(compute if compute is not None else run.dtype).removeprefix("torch.")
        return cls(run.device, run.backend, model, dtype_name(run.dtype), compute_name, run.target)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """No autograd, the backend's numerics (the ``emu:`` emulation) around the body."""
        with torch.no_grad(), self.backend.numerics():
            yield

    def step_fn(self) -> StepFn:
        """The step callable for this side's model."""
        return step_callable(self.model)

    def to_device(self, ids: torch.Tensor) -> torch.Tensor:
        """``ids`` on this side's device."""
        return ids.to(self.backend.torch_device())


def step_callable(model: nn.Module) -> StepFn:
    """``step(input_ids, cache) -> (logits, cache)`` for an HF model or a plain step module."""
    if hasattr(model, "generate") and hasattr(model, "config"):  # an HF causal LM
        from transformers import DynamicCache

        params = inspect.signature(model.forward).parameters
        # transformers 5.x renamed past_key_values to cache; pass whichever forward names
        name = "cache" if "cache" in params else "past_key_values"
        trims = "logits_to_keep" in params

        def hf_step(ids: torch.Tensor, cache: Any, keep: int = 1) -> tuple[torch.Tensor, Any]:
            if cache is None:
                cache = DynamicCache(config=model.config)
            # only the last `keep` positions' logits: a prefill of 2k tokens over a 128k
            # vocabulary would otherwise hold a gigabyte of logits nobody reads
            extra = {"logits_to_keep": keep} if trims else {}
            out = model(input_ids=ids, use_cache=True, **{name: cache}, **extra)
            # a DynamicCache is updated in place (reading the output's past_key_values
            # only prints transformers' deprecation notice)
            return out.logits, cache

        return hf_step

    if _takes_one_input(model):
        return _history_step(model)

    def plain_step(ids: torch.Tensor, cache: Any, keep: int = 1) -> tuple[torch.Tensor, Any]:
        out = model(ids, cache)
        if not (isinstance(out, tuple) and len(out) == 2 and isinstance(out[0], torch.Tensor)):
            raise TargetError(
                f"model {type(model).__name__}: expected forward(input_ids, cache) to return "
                f"(logits, cache), got {type(out).__name__}"
            )
        return out

    return plain_step


class TokenHistory:
    """The "cache" of a model without one: the ids so far (holds no tensor to compare)."""

    def __init__(self, ids: torch.Tensor) -> None:
        self.ids = ids


def _takes_one_input(model: nn.Module) -> bool:
    """True when ``forward`` takes the input ids alone (no cache argument)."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    variadic = any(p.kind == p.VAR_POSITIONAL for p in params)
    return len(positional) == 1 and not variadic


def _history_step(model: nn.Module) -> StepFn:
    """Decode a model without a KV cache: each step runs the whole sequence again."""

    def step(ids: torch.Tensor, cache: Any, keep: int = 1) -> tuple[torch.Tensor, Any]:
        full = ids if cache is None else torch.cat([cache.ids, ids], dim=1)
        out = model(full)
        logits = out.logits if hasattr(out, "logits") else out
        if not isinstance(logits, torch.Tensor):
            raise TargetError(
                f"model {type(model).__name__}: expected forward(input_ids) to return logits, "
                f"got {type(out).__name__}"
            )
        return logits, TokenHistory(full)

    return step


def hidden_size(model: nn.Module, vocab: int) -> int | None:
    """The reduction length of the logits: the hidden size (HF config), else the
    ``in_features`` of the last Linear with ``vocab`` outputs."""
    config = getattr(model, "config", None)
    size = getattr(config, "hidden_size", None)
    if isinstance(size, int):
        return size
    heads = [m for m in model.modules() if isinstance(m, nn.Linear) and m.out_features == vocab]
    return heads[-1].in_features if heads else None


def layer_count(model: nn.Module) -> int:
    """Number of residual blocks (HF ``num_hidden_layers``, else the longest ModuleList)."""
    config = getattr(model, "config", None)
    n = getattr(config, "num_hidden_layers", None)
    if isinstance(n, int) and n > 0:
        return n
    lists = [len(m) for m in model.modules() if isinstance(m, nn.ModuleList)]
    return max(lists, default=1) or 1


def cache_tensors(cache: Any) -> dict[str, torch.Tensor]:
    """The cache's tensors by name (``layers.{i}.keys`` / ``.values``), copied to the host.

    Reads an HF ``Cache`` (``.layers[i].keys``/``.values``), the legacy tuple of
    ``(key, value)`` pairs, or any nesting of lists, tuples and dicts of tensors.
    """
    layers = getattr(cache, "layers", None)
    hf = layers is not None and not isinstance(cache, (list, tuple, dict))
    if hf:  # an HF cache holds no empty tensor worth naming: a layer not yet written
        cache = [(getattr(layer, "keys", None), getattr(layer, "values", None)) for layer in layers]
    if isinstance(cache, (list, tuple)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 for p in cache
    ):
        return {
            f"layers.{i}.{part}": _host(t)
            for i, pair in enumerate(cache)
            for part, t in zip(("keys", "values"), pair, strict=True)
            if isinstance(t, torch.Tensor) and (t.numel() or not hf)
        }
    found: dict[str, torch.Tensor] = {}
    _walk(cache, "", found)
    return found


def _walk(obj: Any, prefix: str, found: dict[str, torch.Tensor]) -> None:
    if isinstance(obj, torch.Tensor):
        found[prefix or "cache"] = _host(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            _walk(v, f"{prefix}.{k}" if prefix else str(k), found)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _walk(v, f"{prefix}.{i}" if prefix else str(i), found)


def _host(t: torch.Tensor) -> torch.Tensor:
    # keep the stored dtype visible: the copy is on the CPU, in the cache's own dtype
    return t.detach().to("cpu", copy=True)


@dataclass
class Decoding:
    """What one side computed for one prompt."""

    scores: torch.Tensor  # [steps, vocab] float32 logits of each step
    chosen: list[int]  # the token this side would choose at each step
    caches: dict[str, dict[str, torch.Tensor]] = field(default_factory=dict)
    free_scores: torch.Tensor | None = None  # [steps, vocab] from one cache-free forward


def choose(scores: torch.Tensor, noise: torch.Tensor | None, temperature: float) -> int:
    """Greedy: argmax of the logits; sampling: argmax of logits / T + Gumbel noise.

    The host's work on the float32 logits, as on a real device, so outside the device's
    arithmetic: under ``emu:bf16`` ``logits / T + noise`` would be rounded to bf16 and
    argmax could pick a token neither side's logits prefer.
    """
    with capture_scope():
        if noise is None:
            return int(torch.argmax(scores))
        return int(torch.argmax(scores / temperature + noise))


def decode(
    side: DecodeSide,
    prompt: torch.Tensor,
    steps: int,
    *,
    forced: list[int] | None = None,
    noise: torch.Tensor | None = None,
    temperature: float = 1.0,
    cache_free: bool = True,
    on_step: Callable[[int], None] | None = None,
) -> Decoding:
    """Decode ``steps`` tokens after ``prompt`` (``[1, P]`` ids) with a KV cache.

    Each step feeds ``forced[t]`` when given (the golden's tokens), else the
    token this side chose. The cache is copied to the host after the prefill and
    after the last token fed; with ``cache_free`` one forward without a cache over
    the prompt and the fed tokens gives every step's logits again.
    """
    step = side.step_fn()
    rows: list[torch.Tensor] = []
    chosen: list[int] = []
    fed: list[int] = []
    caches: dict[str, dict[str, torch.Tensor]] = {}
    try:
        with side.running():
            logits, cache = step(side.to_device(prompt), None)
            rows.append(_row(logits))
            caches["prefill"] = cache_tensors(cache)
            for t in range(steps):
                chosen.append(choose(rows[-1], None if noise is None else noise[t], temperature))
                if on_step is not None:
                    on_step(t)
                if t == steps - 1:
                    break
                token = forced[t] if forced is not None else chosen[t]
                fed.append(token)
                logits, cache = step(side.to_device(torch.tensor([[token]])), cache)
                rows.append(_row(logits))
                if t + 1 == steps - 1:
                    caches[f"step {t + 1}"] = cache_tensors(cache)
            free = None
            if cache_free:
                ids = torch.cat([prompt, torch.tensor([fed], dtype=prompt.dtype)], dim=1)
                logits, _ = step(side.to_device(ids), None, keep=steps)
                free = logits.reshape(-1, logits.shape[-1])[-steps:].float().cpu()
    except TargetError:
        raise
    except (Exception, SystemExit) as exc:
        raise TargetError(
            f"target {side.target.name!r}: decoding on {side.device} {raised(exc)}"
        ) from exc
    return Decoding(torch.stack(rows), chosen, caches, free)


def _row(logits: torch.Tensor) -> torch.Tensor:
    """The last position's logits as a float32 host vector."""
    return logits.reshape(-1, logits.shape[-1])[-1].float().cpu()


def gumbel_noise(seed: int, prompt: int, steps: int, vocab: int) -> torch.Tensor:
    """Gumbel(0, 1) noise for sampling, from a CPU generator: the same on every device.

    argmax(logits / T + g) draws from softmax(logits / T) (the Gumbel-max trick),
    so both sides sample with the same randomness and differ only where their
    logits do.
    """
    # modulo 2**64: a generator's seed is 64 bits, and torch wraps a negative one the same
    # way, so every seed in range draws what it always drew and a larger one cannot overflow
    gen = torch.Generator().manual_seed((seed * 1_000_003 + prompt) % 2**64)
    u = torch.rand((steps, vocab), generator=gen, dtype=torch.float64)
    u = u.clamp(min=math.ulp(0.0) * 2**60, max=1 - 2**-53)
    return (-torch.log(-torch.log(u))).float()
