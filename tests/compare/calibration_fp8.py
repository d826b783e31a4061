"""The fp8 pairs of the calibration corpus (issue 40).

Clean pairs: tiny-llama (and the handwritten decoder) with every Linear GEMM in
fp8 (``emu:fp8-*``: e4m3 and e5m2; current, delayed and block scaling) against an
fp32 or a bf16 golden; they must MATCH. Fault pairs plant one classic fp8
failure in one Linear and must name it:

- **stale amax**: the scale of ``model.layers.1.mlp.up_proj``'s activation comes
  from an amax history recorded before its activations grew ``factor``-fold (a loss
  spike): every value above ``amax / factor`` saturates at the format's max;
- **shared block scale**: under block scaling, the first 1 x 128 activation tile
  of ``model.layers.1.mlp.down_proj`` (the attention-sink token's, 32x the others)
  is quantized with the scale of the next token's tile (a scale read at the wrong
  index), so it saturates;
- **saturated outlier channel**: a model with an outlier feature (one channel of
  the layer-1 MLP input ``factor`` times the others, as trained LLMs have) whose
  ``up_proj`` scale was taken without that channel: the channel saturates.

The stale amax and the outlier channel are planted as the clip the wrong scale
causes, before the emulator's own quantization: the emulator then derives exactly
the wrong scale from the clipped tensor (its amax is the clip bound), so the GEMM
computes what the faulty kernel computes. The shared block scale is planted inside
the emulator's GEMM (its block scales, for that one Linear), because compare does
not name it (see docs/fp8.md) and the ``fp8`` checklist, which reads the GEMM's
operand statistics, is the tool that must.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

import torch
from torch import nn

import precguard
from precguard.backends.emu import fp8
from precguard.targets import build_tiny_llama, causal_lm_loss, lm_batch

# the corpus module beside this one, imported as the tests (tests.compare.*) or the
# benchmark (tests/compare on sys.path) import it
_package = __name__.rpartition(".")[0]
_corpus = importlib.import_module(
    f"{_package}.calibration_corpus" if _package else "calibration_corpus"
)
MODELS, Pair, Prepare, Recipe = _corpus.MODELS, _corpus.Pair, _corpus.Prepare, _corpus.Recipe

FP32 = Recipe()
BF16 = Recipe("emu:bf16-mixed")
E4M3 = Recipe("emu:fp8-e4m3")
E4M3_BLOCK = Recipe("emu:fp8-e4m3-block")
E4M3_DELAYED = Recipe("emu:fp8-e4m3-delayed")
E5M2 = Recipe("emu:fp8-e5m2")
#: the outlier channel of the outlier model, and how much larger than the others it is
OUTLIER_CHANNEL, OUTLIER_FACTOR = 7, 32.0
#: the emulator's own block scales (the shared-block-scale fault swaps them for one GEMM)
_activation_scales = fp8.activation_scales


def _outlier_model() -> nn.Module:
    """tiny-llama whose layer-1 MLP input has one outlier channel (its norm weight x32)."""
    model = build_tiny_llama()
    with torch.no_grad():
        norm = model.get_submodule("model.layers.1.post_attention_layernorm")
        norm.weight[OUTLIER_CHANNEL] *= OUTLIER_FACTOR
    return model


def _outlier_target() -> precguard.Target:
    return precguard.Target(
        model=_outlier_model,
        batch=lm_batch,
        loss=causal_lm_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        seed=0,
        name="tiny-llama-outlier",
    )


#: how much larger the sink token's MLP activations are than the other tokens'
SINK_FACTOR = 32.0


def _sink_model() -> nn.Module:
    """tiny-llama whose first token's layer-1 MLP activations are 32x the others'."""
    model = build_tiny_llama()

    def sink(_m: nn.Module, _args: tuple, out: torch.Tensor) -> torch.Tensor:
        scale = torch.ones_like(out[..., :1])  # (batch, positions, 1)
        scale[..., 0, :] = SINK_FACTOR
        return out * scale

    model.get_submodule("model.layers.1.mlp.up_proj").register_forward_hook(sink)
    return model


def _sink_target() -> precguard.Target:
    return precguard.Target(
        model=_sink_model,
        batch=lm_batch,
        loss=causal_lm_loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=1e-3),
        seed=0,
        name="tiny-llama-sink",
    )


MODELS["tiny-llama-outlier"] = _outlier_target
MODELS["tiny-llama-sink"] = _sink_target


def _clip_input(path: str, bound: Callable[[torch.Tensor], torch.Tensor]) -> Prepare:
    """Clip the input of the Linear at ``path`` where ``bound(x)`` says (a tensor of x's
    shape or a scalar): the saturation its wrong scale causes."""

    def plant(model: nn.Module) -> None:
        mod = model.get_submodule(path)
        assert isinstance(mod, nn.Linear)

        forward = mod.forward

        def clipped(x: torch.Tensor) -> torch.Tensor:
            # inside the layer's own forward: what its GEMM reads, not what it was given
            limit = bound(x.detach())
            return forward(torch.maximum(torch.minimum(x, limit), -limit))

        mod.forward = clipped  # type: ignore[method-assign]

    return plant


def stale_amax(factor: float, path: str = "model.layers.1.mlp.up_proj") -> Prepare:
    """The activation scale of ``path`` from an amax ``factor`` times smaller than now."""
    return _clip_input(path, lambda x: x.abs().amax() / factor)


def shared_block_scale(path: str = "model.layers.1.mlp.down_proj", block: int = 128) -> Prepare:
    """While ``path`` runs, the block-scaled emulator quantizes its activation's first
    1 x ``block`` tile (the first token's) with the scale of the next token's tile: the
    scale read for the wrong block, inside the GEMM, so the tile saturates there and the
    GEMM's operand statistics (what the ``fp8`` checks read) see it."""

    def wrong(x: torch.Tensor, recipe: fp8.Fp8Recipe) -> torch.Tensor:
        scales = _activation_scales(x, recipe).clone()
        rows = scales.reshape(-1, scales.shape[-1])  # a view: (M, K) of a 2-D GEMM operand
        if rows.shape[0] > 1:
            rows[0, :block] = rows[1, :block]
        return scales

    def misread(_m: nn.Module, _args: tuple) -> None:
        fp8.activation_scales = wrong  # only this Linear's GEMM reads the wrong scale

    def restore(_m: nn.Module, _args: tuple, _out: torch.Tensor) -> None:
        fp8.activation_scales = _activation_scales

    def plant(model: nn.Module) -> None:
        # hooks, not a replaced forward: a copy of the model (the checks copy it per
        # side) keeps them, each acting on its own module
        mod = model.get_submodule(path)
        assert isinstance(mod, nn.Linear)
        mod.register_forward_pre_hook(misread)
        mod.register_forward_hook(restore, always_call=True)

    return plant


def saturated_outlier(path: str = "model.layers.1.mlp.up_proj") -> Prepare:
    """The outlier channel of ``path``'s input saturates at the other channels' amax."""

    def bound(x: torch.Tensor) -> torch.Tensor:
        others = torch.cat([x[..., :OUTLIER_CHANNEL], x[..., OUTLIER_CHANNEL + 1 :]], -1)
        limit = torch.full_like(x, torch.finfo(torch.float32).max)
        limit[..., OUTLIER_CHANNEL] = others.abs().amax()
        return limit

    return _clip_input(path, bound)


def _train(r: Recipe, steps: int = 3) -> Recipe:
    return Recipe(r.device, r.dtype, True, steps, r.tensors)


def fp8_pairs() -> list[Pair]:
    """The fp8 clean and fault pairs."""
    clean = [
        Pair("tiny-llama fp8-e4m3 vs fp32", "tiny-llama", E4M3, fast=True),
        Pair("tiny-llama fp8-e4m3 vs bf16-mixed", "tiny-llama", E4M3, BF16),
        Pair("tiny-llama fp8-e4m3-block vs bf16-mixed", "tiny-llama", E4M3_BLOCK, BF16),
        Pair("tiny-llama fp8-e4m3-delayed vs bf16-mixed", "tiny-llama", E4M3_DELAYED, BF16),
        Pair("tiny-llama fp8-e5m2 vs bf16-mixed", "tiny-llama", E5M2, BF16),
        Pair("tiny-llama-outlier fp8-e4m3 vs fp32", "tiny-llama-outlier", E4M3),
        Pair(
            "tiny-llama-sink fp8-e4m3-block vs fp32",
            "tiny-llama-sink",
            E4M3_BLOCK,
            checklist="fp8",
        ),
        Pair("hw4 fp8-e4m3 vs fp32", "hw4", E4M3),
        Pair("hw4 fp8-e4m3-block vs fp32", "hw4", E4M3_BLOCK),
        Pair(
            "tiny-llama labels train fp8-e4m3-delayed x3",
            "tiny-llama-labels",
            _train(E4M3_DELAYED),
            _train(FP32),
        ),
        Pair("parallel fp8-e4m3 vs fp32", "parallel", E4M3),
    ]
    faults = []
    for factor in (2, 4, 16):
        faults.append(
            Pair(
                f"tiny-llama fp8-e4m3 stale amax x{factor}",
                "tiny-llama",
                E4M3,
                expect=("model.layers.1.mlp.up_proj",),
                kind=f"fp8 stale amax x{factor}",
                plant=stale_amax(factor),
                fast=factor == 16,
            )
        )
    faults.append(
        Pair(
            "tiny-llama-sink fp8-e4m3-block shared block scale",
            "tiny-llama-sink",
            E4M3_BLOCK,
            expect=("model.layers.1.mlp.down_proj",),
            kind="fp8 shared block scale",
            plant=shared_block_scale(),
            checklist="fp8",  # compare does not name it (docs/fp8.md); fp8.saturation does
        )
    )
    faults.append(
        Pair(
            "tiny-llama-outlier fp8-e4m3 saturated outlier channel",
            "tiny-llama-outlier",
            E4M3,
            expect=("model.layers.1.mlp.up_proj",),
            kind="fp8 saturated outlier channel",
            plant=saturated_outlier(),
            fast=True,
        )
    )
    return clean + faults


__all__ = ["fp8_pairs", "saturated_outlier", "shared_block_scale", "stale_amax"]
