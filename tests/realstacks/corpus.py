"""The real-stacks corpus (issue 28): compare's verdicts in the setups people train and serve with.

Each case records a golden and an actual run of a real library stack — PEFT LoRA,
the HF ``Trainer``, Mixtral and Qwen2-MoE, sdpa against eager attention, autocast,
gradient checkpointing, ``torch.compile``, ``generate()`` with a KV cache, HF
models cast with ``to(bfloat16)`` — through precguard's public API, compares them
and says whether the verdict is right:

- a **clean** pair (a correct low-precision run) must match (exit 0);
- a **fault** pair (a planted error of at least 1 %) must diverge and name the
  module the fault was planted in;
- ``generate()`` whose greedy tokens part at a near-tie is a partial match (exit 3)
  whose gap names the decoding divergence (``partial_text``);
- a few cases have a verdict of their own (``expect_text``): a correct run whose
  difference is real but explained (HF's ``inv_freq`` rounded by ``to(bf16)``),
  and a model compiled before ``monitor`` may be refused with one line instead
  (``refusal_text``).

Sizes are tiny (hidden 64, 2 layers, vocab 256, 2 × 32 tokens, seeded), so one case
takes seconds; ``benchmarks/realworld.py`` runs them all and prints the table,
``tests/realstacks/`` a fast subset.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

import precguard
from precguard import resolve_backend
from precguard.targets import build_tiny_llama

VOCAB = 256
HIDDEN = 64
SEQ = 32

#: how a side runs: the golden is cpu float32; the actual a low-precision way
Workload = Callable[["Side"], None]


@dataclass
class Side:
    """One side of a pair: where it records and how it differs from the golden."""

    out: Path
    actual: bool
    full: bool
    fault: bool
    device: str = "cpu"

    def monitor(self, model: nn.Module, **options: Any) -> Any:
        """``precguard.monitor`` with this side's tensors and device."""
        compute = None
        if self.device.startswith("emu:"):
            dtype = resolve_backend(self.device).compute_dtype()
            compute = str(dtype).removeprefix("torch.") if dtype is not None else None
        return precguard.monitor(
            model,
            self.out,
            tensors=["*"] if self.full else False,
            device=self.device,
            compute_dtype=compute,
            overwrite=True,
            **options,
        )

    @contextlib.contextmanager
    def numerics(self) -> Iterator[None]:
        """The actual device's numerics (an ``emu:`` profile), nothing on the golden side."""
        if self.device == "cpu":
            yield
            return
        with resolve_backend(self.device).numerics():
            yield


@dataclass
class Case:
    """A pair: a workload run on both sides, and what its verdict must be."""

    name: str
    workload: Workload
    full: bool
    #: the actual side's device (the golden's is cpu)
    device: str = "emu:bf16"
    #: None: a clean pair (must match); else the module a planted fault must be named at
    expect: str | None = None
    #: a verdict of its own: every string must appear in the verdict's text (its first
    #: divergence's reason and its warnings)
    expect_text: tuple[str, ...] = ()
    #: with expect_text: the verdict must also be a match (exit 0)
    must_match: bool = False
    #: a partial match (exit 3) whose gaps hold all of these is right too
    partial_text: tuple[str, ...] = ()
    #: a refusal (PrecguardError) whose message holds all of these is right too
    refusal_text: tuple[str, ...] = ()
    #: in the test suite's fast subset
    fast: bool = False
    tags: tuple[str, ...] = field(default_factory=tuple)


@dataclass
class Outcome:
    """What compare said about a case, and whether that is right."""

    case: Case
    verdict: str
    exit_code: int
    named: str | None
    text: str
    ok: bool
    seconds: float


# ---------------------------------------------------------------------------- models


def _seed() -> None:
    torch.manual_seed(0)


def llama(**overrides: Any) -> nn.Module:
    """A tiny ``LlamaForCausalLM`` (2 layers, hidden 64, 1024 positions), seeded."""
    _seed()
    return build_tiny_llama(num_hidden_layers=2, max_position_embeddings=1024, **overrides)


def hf_model(kind: str) -> nn.Module:
    """A tiny seeded HF causal LM of ``kind``: qwen2, mistral, gpt2, mixtral, qwen2-moe;
    ``mixtral-loop``: Mixtral whose experts run one by one (``_experts_implementation =
    "eager"``: each expert's records hold its own tokens, counts differing by side)."""
    import transformers as tf

    _seed()
    common = {"vocab_size": VOCAB, "num_hidden_layers": 2, "attn_implementation": "eager"}
    llama_like = {
        "hidden_size": HIDDEN, "intermediate_size": 176, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 1024,
    }  # fmt: skip
    if kind == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**common, **llama_like))
    if kind == "mistral":
        return tf.MistralForCausalLM(tf.MistralConfig(**common, **llama_like))
    if kind == "gpt2":
        config = tf.GPT2Config(
            n_embd=HIDDEN, n_head=4, n_positions=256, bos_token_id=0, eos_token_id=0, **common
        )
        return tf.GPT2LMHeadModel(config)
    if kind in ("mixtral", "mixtral-loop"):
        config = tf.MixtralConfig(
            **common, **llama_like, num_local_experts=4, num_experts_per_tok=2
        )
        if kind == "mixtral-loop":
            config._experts_implementation = "eager"
        return tf.MixtralForCausalLM(config)
    if kind == "qwen2-moe":
        config = tf.Qwen2MoeConfig(
            **common, **llama_like, num_experts=4, num_experts_per_tok=2,
            moe_intermediate_size=88, shared_expert_intermediate_size=88,
        )  # fmt: skip
        return tf.Qwen2MoeForCausalLM(config)
    return _more_models(kind, common, llama_like)


def _more_models(kind: str, common: dict[str, Any], llama_like: dict[str, Any]) -> nn.Module:
    """The stacks of issue 37: more routers (gpt-oss, DeepSeek-V3, Qwen3-MoE, Mixtral's
    batched experts kernel, Llama 4, PhiMoE) and controls without one (Gemma2, Qwen3, llama3
    rope scaling)."""
    import transformers as tf

    if kind == "gpt-oss":
        # top-k on the logits, softmax over the k chosen (weights in top-k order), an
        # eager loop over experts held as 3-d parameters, no child modules
        config = tf.GptOssConfig(
            **common, **llama_like, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
            layer_types=["full_attention", "full_attention"],
            rope_parameters={
                "rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 32,
            },
        )  # fmt: skip
        return tf.GptOssForCausalLM(config)
    if kind == "deepseek-v3":
        # sigmoid scores, a learned bias added before a group-limited top-k (unsorted),
        # weights gathered from the unbiased scores, a shared expert beside the routed ones
        config = tf.DeepseekV3Config(
            **common, hidden_size=HIDDEN, intermediate_size=176, moe_intermediate_size=32,
            num_attention_heads=4, num_key_value_heads=4, n_routed_experts=8,
            num_experts_per_tok=2, n_group=4, topk_group=2, first_k_dense_replace=0,
            n_shared_experts=1, q_lora_rank=32, kv_lora_rank=32, qk_rope_head_dim=8,
            qk_nope_head_dim=8, v_head_dim=16, max_position_embeddings=1024,
        )  # fmt: skip
        model = tf.DeepseekV3ForCausalLM(config)
        with torch.no_grad():
            for layer in model.model.layers:
                gate = layer.mlp.gate
                gate.e_score_correction_bias.copy_(0.05 * torch.randn(gate.num_experts))
        return model
    if kind == "qwen3-moe":
        config = tf.Qwen3MoeConfig(
            **common, **llama_like, num_experts=8, num_experts_per_tok=2,
            moe_intermediate_size=32, norm_topk_prob=True,
        )  # fmt: skip
        return tf.Qwen3MoeForCausalLM(config)
    if kind == "mixtral-batched":
        # the fused experts kernel: every token-expert pair in one batched matmul
        config = tf.MixtralConfig(
            **common, **llama_like, num_local_experts=4, num_experts_per_tok=2
        )
        config._experts_implementation = "batched_mm"
        return tf.MixtralForCausalLM(config)
    if kind == "llama4":
        # complex64 rotary frequencies (torch.polar), a sigmoid top-1 router, a shared expert
        config = tf.Llama4TextConfig(
            **common, **llama_like, intermediate_size_mlp=176, num_local_experts=4,
            num_experts_per_tok=1, head_dim=16, interleave_moe_layer_step=1,
            no_rope_layers=[1, 1],
        )  # fmt: skip
        return tf.Llama4ForCausalLM(config)
    if kind == "phimoe":
        # sparsemixer: each choice's weight a softmax over the scores within 2 * jitter of
        # the best one (a mask that flips on a near-tie while the experts stay)
        config = tf.PhimoeConfig(**common, **llama_like, num_local_experts=4, num_experts_per_tok=2)
        return tf.PhimoeForCausalLM(config)
    if kind == "gemma2":
        config = tf.Gemma2Config(
            **common, **llama_like, head_dim=16, attn_logit_softcapping=50.0,
            final_logit_softcapping=30.0, sliding_window=16,
        )  # fmt: skip
        return tf.Gemma2ForCausalLM(config)
    if kind == "qwen3":
        return tf.Qwen3ForCausalLM(tf.Qwen3Config(**common, **llama_like, head_dim=16))
    if kind == "llama3-rope":
        rope = {
            "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,
        }  # fmt: skip
        return tf.LlamaForCausalLM(tf.LlamaConfig(**common, **llama_like, rope_parameters=rope))
    raise ValueError(kind)


def batch(step: int = 0, *, size: int = 2, seq: int = SEQ) -> dict[str, torch.Tensor]:
    """Token ids and labels for ``step`` from a seeded CPU generator."""
    gen = torch.Generator().manual_seed(1234 + step)
    ids = torch.randint(0, VOCAB, (size, seq), generator=gen)
    return {"input_ids": ids, "labels": ids.clone()}


def scale_output(module: nn.Module, factor: float) -> None:
    """Plant a fault: ``module``'s output multiplied by ``factor`` (a forward hook)."""

    def hook(_m: nn.Module, _args: Any, output: Any) -> Any:
        return output * factor

    module.register_forward_hook(hook)


# ---------------------------------------------------------------------------- workloads


def lora_training(side: Side) -> None:
    """PEFT LoRA on q/v projections, 3 AdamW steps (a hand-written loop)."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(
        llama(), LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    if side.fault:
        scale_output(model.base_model.model.model.layers[1].self_attn.v_proj.lora_B.default, 1.03)
    adamw_steps(model, side)


def full_training(side: Side) -> None:
    """Full fine-tune of the tiny LLaMA, 3 AdamW steps."""
    model = llama()
    if side.fault:
        scale_output(model.model.layers[1].mlp.down_proj, 1.03)
    adamw_steps(model, side)


def adamw_steps(model: nn.Module, side: Side, steps: int = 3) -> None:
    """``steps`` AdamW steps of a hand-written loop under ``monitor``, every step recorded."""
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    with (
        side.numerics(),
        side.monitor(model, backward=True, params="every_step", auto_step=False) as h,
    ):
        for step in range(steps):
            out = model(**batch(step))
            out.loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            h.step()


def hf_trainer(side: Side) -> None:
    """HF ``Trainer``, fp32 golden against ``bf16=True``, 4 steps, the watch recording each."""
    from transformers import Trainer, TrainingArguments

    from precguard.training.hf import PrecguardWatchCallback

    model = llama()
    data = []
    for step in range(8):
        ids = batch(step, size=1)["input_ids"][0]
        data.append({"input_ids": ids, "labels": ids})
    watch_dir = side.out.parent / (side.out.name + "-watch")
    shutil.rmtree(watch_dir, ignore_errors=True)
    args = TrainingArguments(
        output_dir=str(side.out.parent / (side.out.name + "-trainer")),
        max_steps=4, per_device_train_batch_size=2, learning_rate=1e-3, report_to=[],
        save_strategy="no", logging_strategy="no", use_cpu=True, seed=0,
        dataloader_num_workers=0, bf16=side.actual,
    )  # fmt: skip
    callback = PrecguardWatchCallback(watch_dir, every=1)
    Trainer(model=model, args=args, train_dataset=data, callbacks=[callback]).train()
    shutil.rmtree(side.out, ignore_errors=True)
    shutil.copytree(watch_dir / "recording", side.out)


def forward(kind: str, fault: Callable[[nn.Module], None] | None = None) -> Workload:
    """One forward of a tiny HF model of ``kind`` (``llama`` or :func:`hf_model`'s kinds)."""

    def run(side: Side) -> None:
        model = llama() if kind == "llama" else hf_model(kind)
        model.eval()
        if side.fault and fault is not None:
            fault(model)
        with side.numerics(), side.monitor(model), torch.no_grad():
            model(input_ids=batch()["input_ids"])

    run.__doc__ = f"one forward of a tiny {kind}"
    return run


def training_step(kind: str, fault: Callable[[nn.Module], None] | None = None) -> Workload:
    """One training step (forward and backward, no optimizer) of a tiny HF model of ``kind``
    (:func:`hf_model`'s kinds), in train mode, every record's tensors when the side is full."""

    def run(side: Side) -> None:
        model = hf_model(kind)
        model.train()
        if side.fault and fault is not None:
            fault(model)
        with side.numerics(), side.monitor(model, backward=True):
            model(**batch()).loss.backward()

    run.__doc__ = f"one training step of a tiny {kind}"
    return run


def qwen2_vl() -> nn.Module:
    """A tiny seeded Qwen2-VL: a 2-block vision tower (4-pixel patches merged 2 x 2) and a
    2-layer text model with multimodal rotary positions (M-RoPE)."""
    import transformers as tf

    _seed()
    vision = {
        "depth": 2, "embed_dim": 32, "hidden_size": HIDDEN, "num_heads": 4, "mlp_ratio": 2,
        "patch_size": 4, "spatial_merge_size": 2, "temporal_patch_size": 2, "in_channels": 3,
    }  # fmt: skip
    text = {
        "vocab_size": VOCAB, "hidden_size": HIDDEN, "intermediate_size": 176,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 1024, "bos_token_id": 0, "eos_token_id": 0,
        "rope_parameters": {"rope_type": "default", "mrope_section": [2, 2, 4], "rope_theta": 1e4},
    }  # fmt: skip
    config = tf.Qwen2VLConfig(
        vision_config=vision, text_config=text, image_token_id=250, video_token_id=251,
        vision_start_token_id=252, vision_end_token_id=253, attn_implementation="eager",
        bos_token_id=0, eos_token_id=0,
    )  # fmt: skip
    return tf.Qwen2VLForConditionalGeneration(config)


def vision_language(fault: float | None = None) -> Workload:
    """One forward of the tiny Qwen2-VL on a 16 x 16 image (4 merged patches) in a
    32-token prompt; ``fault`` scales the text model's layer 1 ``down_proj`` output."""

    def run(side: Side) -> None:
        model = qwen2_vl().eval()
        if side.fault and fault is not None:
            scale_output(model.model.language_model.layers[1].mlp.down_proj, fault)
        gen = torch.Generator().manual_seed(1234)
        ids = torch.randint(0, 240, (1, SEQ), generator=gen)
        ids[0, 2], ids[0, 3:7], ids[0, 7] = 252, 250, 253
        kinds = (ids == 250).long()
        pixels = torch.randn(16, 3 * 2 * 4 * 4, generator=gen)
        grid = torch.tensor([[1, 4, 4]])
        with side.numerics(), side.monitor(model), torch.no_grad():
            model(input_ids=ids, pixel_values=pixels, image_grid_thw=grid, mm_token_type_ids=kinds)

    return run


def routed_experts(model: nn.Module) -> nn.Module:
    """Layer 1's routed experts (``mlp.experts``; Llama 4's ``feed_forward.experts``)."""
    layer = model.model.layers[1]
    return layer.feed_forward.experts if hasattr(layer, "feed_forward") else layer.mlp.experts


def expert_fault(model: nn.Module) -> None:
    """Scale expert 1's output projection in layer 1 by 1.03."""
    experts = routed_experts(model)
    with torch.no_grad():
        weight = getattr(experts, "down_proj", None)
        if isinstance(weight, torch.Tensor | nn.Parameter) and weight.dim() == 3:
            weight[1] *= 1.03
        else:
            experts[1].w2.weight *= 1.03


def attention(padding: bool) -> Workload:
    """Eager attention on the golden side, sdpa on the actual, both cpu fp32."""

    def run(side: Side) -> None:
        model = llama(attn_implementation="sdpa" if side.actual else "eager").eval()
        if side.fault:
            scale_output(model.model.layers[1].mlp.down_proj, 1.03)
        ids = batch()["input_ids"]
        mask = torch.ones_like(ids)
        if padding:
            mask[0, :5] = 0
        with side.monitor(model), torch.no_grad():
            model(input_ids=ids, attention_mask=mask)

    return run


def autocast(side: Side) -> None:
    """A forward under ``torch.autocast("cpu", bfloat16)`` on the actual side."""
    model = llama().eval()
    if side.fault:
        scale_output(model.model.layers[1].mlp.down_proj, 1.05)
    ctx = torch.autocast("cpu", torch.bfloat16) if side.actual else contextlib.nullcontext()
    with ctx, side.monitor(model), torch.no_grad():
        model(input_ids=batch()["input_ids"])


def checkpointing(side: Side) -> None:
    """One training step; the actual side with HF gradient checkpointing (both cpu fp32)."""
    model = llama()
    if side.actual:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    with side.monitor(model, backward=True):
        model(**batch()).loss.backward()


def utils_checkpoint(side: Side) -> None:
    """One training step; the actual side runs each MLP under ``torch.utils.checkpoint``
    (non-reentrant), not through HF's switch (both cpu fp32)."""
    from torch.utils.checkpoint import checkpoint

    model = llama()
    if side.actual:
        for layer in model.model.layers:
            forward = layer.mlp.forward
            layer.mlp.forward = lambda x, forward=forward: checkpoint(
                forward, x, use_reentrant=False
            )
    model.train()
    with side.monitor(model, backward=True):
        model(**batch()).loss.backward()


def monitor_then_compile(side: Side) -> None:
    """The actual side is monitored, then compiled (``aot_eager``: dynamo and AOT autograd
    without a C++ compiler), and run: recorded whole, compared with the eager golden."""
    model = llama().eval()
    ids = batch()["input_ids"]
    with side.monitor(model), torch.no_grad():
        run = torch.compile(model, backend="aot_eager") if side.actual else model
        run(input_ids=ids)


def compiled_before_monitor(side: Side) -> None:
    """The actual side compiles and runs the model once before ``monitor`` sees it."""
    model = llama().eval()
    ids = batch()["input_ids"]
    if side.actual:
        compiled = torch.compile(model, backend="eager")
        with torch.no_grad():
            compiled(input_ids=ids)
        model = compiled
    with side.monitor(model), torch.no_grad():
        model(input_ids=ids)


def generate(side: Side) -> None:
    """HF ``generate()`` with a KV cache, 16 new greedy tokens, under ``monitor``."""
    model = llama().eval()
    ids = batch(size=1)["input_ids"][:, :8]
    with side.numerics(), side.monitor(model), torch.no_grad():
        model.generate(ids, max_new_tokens=16, do_sample=False, min_new_tokens=16)


def cast(kind: str, seq: int = SEQ) -> Workload:
    """A tiny HF model cast with ``model.to(torch.bfloat16)`` on the actual side.

    At 512 positions the rotary angles from the cast's rounded ``inv_freq`` are off by
    tens of roundings (a real error, whose cause is the buffer).
    """

    def run(side: Side) -> None:
        model = (llama() if kind == "llama" else hf_model(kind)).eval()
        if side.actual:
            model = model.to(torch.bfloat16)
        with side.monitor(model), torch.no_grad():
            model(input_ids=batch(size=1, seq=seq)["input_ids"])

    return run


# ---------------------------------------------------------------------------- the corpus

_INV_FREQ = ("rotary_emb", "inv_freq")


def _cases() -> list[Case]:
    cases: list[Case] = []
    for full in (False, True):
        lvl = "full" if full else "stats"
        cases += [
            Case(f"lora 3 AdamW steps bf16 [{lvl}]", lora_training, full, fast=not full),
            Case(
                f"lora fault 3% lora_B [{lvl}]",
                lora_training,
                full,
                expect="layers.1.self_attn.v_proj.lora_B",
            ),
            Case(f"full fine-tune bf16 [{lvl}]", full_training, full),
            Case(
                f"full fine-tune fault 3% down_proj [{lvl}]",
                full_training,
                full,
                expect="layers.1.mlp.down_proj",
            ),
            Case(f"mixtral bf16 [{lvl}]", forward("mixtral"), full, fast=full),
            Case(f"qwen2-moe bf16 [{lvl}]", forward("qwen2-moe"), full),
            Case(
                f"mixtral fault 3% expert [{lvl}]",
                forward("mixtral", expert_fault),
                full,
                expect="layers.1.mlp.experts",
            ),
            Case(f"autocast bf16 [{lvl}]", autocast, full, device="cpu"),
            Case(
                f"autocast fault 5% down_proj [{lvl}]",
                autocast,
                full,
                device="cpu",
                expect="layers.1.mlp.down_proj",
                fast=not full,
            ),
            # greedy tokens may part at a near-tie: then a decoding divergence, no layer
            Case(
                f"generate kv-cache bf16 [{lvl}]",
                generate,
                full,
                partial_text=("decoding divergence", "generate-diff"),
            ),
            Case(f"gpt2 to(bf16) [{lvl}]", cast("gpt2"), full, device="cpu"),
            Case(f"mixtral per-expert loop bf16 [{lvl}]", forward("mixtral-loop"), full),
            Case(
                f"mixtral per-expert loop, fault 3% expert [{lvl}]",
                forward("mixtral-loop", expert_fault),
                full,
                expect="layers.1.mlp.experts",
            ),
            Case(f"qwen2 bf16 [{lvl}]", forward("qwen2"), full),
            Case(f"mistral bf16 [{lvl}]", forward("mistral"), full),
        ]
        cases += _routers(full, lvl)
    cases += [
        Case("hf trainer bf16=True [stats]", hf_trainer, False, device="cpu", fast=True),
        Case("sdpa vs eager [full]", attention(False), True, device="cpu", fast=True),
        Case("sdpa vs eager, padded [full]", attention(True), True, device="cpu"),
        Case("sdpa vs eager, padded [stats]", attention(True), False, device="cpu"),
        Case(
            "sdpa vs eager, padded, fault 3% down_proj [stats]",
            attention(True),
            False,
            device="cpu",
            expect="layers.1.mlp.down_proj",
        ),
        Case("sdpa vs eager [stats]", attention(False), False, device="cpu"),
        Case(
            "checkpointing vs none [stats]",
            checkpointing,
            False,
            device="cpu",
            fast=True,
            expect_text=("recomput",),
            must_match=True,
        ),
        Case(
            "checkpointing vs none [full]",
            checkpointing,
            True,
            device="cpu",
            expect_text=("recomput",),
            must_match=True,
        ),
        Case(
            "torch.utils.checkpoint vs none [full]",
            utils_checkpoint,
            True,
            device="cpu",
            expect_text=("recomput",),
            must_match=True,
        ),
        Case("monitor then compile vs eager [full]", monitor_then_compile, True, device="cpu"),
        Case(
            "compiled before monitor [stats]",
            compiled_before_monitor,
            False,
            device="cpu",
            refusal_text=("_orig_mod",),
        ),
        Case(
            "llama to(bf16): inv_freq rounded [full]",
            cast("llama", 512),
            True,
            device="cpu",
            expect_text=_INV_FREQ,
        ),
        Case(
            "qwen2 to(bf16): inv_freq rounded [full]",
            cast("qwen2", 512),
            True,
            device="cpu",
            expect_text=_INV_FREQ,
        ),
        Case(
            "mistral to(bf16): inv_freq rounded [stats]",
            cast("mistral", 512),
            False,
            device="cpu",
            expect_text=_INV_FREQ,
        ),
    ]
    return cases


def experts_fault(model: nn.Module) -> None:
    """Scale layer 1's experts' output by 1.03 (a forward hook: the parameters stay equal,
    so the fault is found from the numbers the experts compute, not from their weights)."""
    scale_output(routed_experts(model), 1.03)


def shared_expert_fault(model: nn.Module) -> None:
    """Scale layer 1's shared expert's output projection by 1.03 (DeepSeek-V3)."""
    scale_output(model.model.layers[1].mlp.shared_experts.down_proj, 1.03)


#: issue 37's routers; Llama 4 (complex rotary frequencies, top-1 sigmoid router, a shared
#: expert) and PhiMoE (sparsemixer: scores masked near the best one) were tried as stacks
#: outside the corpus after it, and false-alarmed until complex tensors were measured as
#: floats and a weight that jumps while the experts stay was judged as a re-routing
_ROUTED = ("gpt-oss", "deepseek-v3", "qwen3-moe", "mixtral-batched", "mixtral")


def unmasked_router(model: nn.Module) -> None:
    """PhiMoE's routers weigh every expert (a fused router kernel that drops sparsemixer's
    mask: jitter 1 keeps every score within 200 % of the best one), the experts unchanged."""
    for layer in model.model.layers:
        layer.mlp.router.router_jitter_noise = 1.0


def _routers(full: bool, lvl: str) -> list[Case]:
    """Issue 37: routers judged by expert identity (each clean, each with a planted fault,
    forward and one training step), and stacks without a router as controls."""
    cases: list[Case] = []
    # with full tensors the experts compute 3 % too much (their weights equal); with
    # statistics only one expert's weights are 3 % off: a few-percent scale of what the
    # experts compute is below what statistics can tell on re-routed rows (docs/realworld.md)
    fault, what = (experts_fault, "experts") if full else (expert_fault, "expert 1 weights")
    for kind in (*_ROUTED, "llama4", "phimoe"):
        experts = "layers.1.feed_forward.experts" if kind == "llama4" else "layers.1.mlp.experts"
        cases += [
            Case(
                f"{kind} training step bf16 [{lvl}]",
                training_step(kind),
                full,
                fast=full and kind == "mixtral",
            ),
            Case(
                f"{kind} training step, fault 3% {what} [{lvl}]",
                training_step(kind, fault),
                full,
                expect=experts,
            ),
        ]
        if kind != "mixtral":  # its forward cases are above
            cases += [
                Case(
                    f"{kind} bf16 [{lvl}]",
                    forward(kind),
                    full,
                    fast=full and kind in ("deepseek-v3", "llama4", "phimoe"),
                ),
                Case(
                    f"{kind} fault 3% {what} [{lvl}]",
                    forward(kind, fault),
                    full,
                    expect=experts,
                ),
            ]
    cases += _gates(full, lvl)
    if not full:  # 3 % on the shared expert is below what statistics tell (docs/realworld.md)
        return cases + _controls(full, lvl, faults=False)
    cases.append(
        Case(
            f"deepseek-v3 fault 3% shared expert [{lvl}]",
            forward("deepseek-v3", shared_expert_fault),
            full,
            expect="layers.1.mlp.shared_experts",
        )
    )
    cases.append(
        Case(
            f"phimoe fault router without its mask [{lvl}]",
            forward("phimoe", unmasked_router),
            full,
            expect="layers.0.mlp.router",
        )
    )
    return cases + _controls(full, lvl, faults=True)


class Bf16Kernels(TorchDispatchMode):
    """A device whose float32 kernels compute in bf16: every float32 result an op writes is
    rounded to bf16, still stored as float32 (views pass through: they hold what an op
    wrote). Ops inside it run through the modes below it (the ``emu:`` profile's)."""

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if func.is_view or torch.Tag.inplace_view in func.tags:
            return out
        if func._schema.is_mutable:  # written in place: round what it wrote, in place
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
                    t.copy_(t.to(torch.bfloat16))
            return out
        return tree_map(_in_bf16, out)


def _in_bf16(t: Any) -> Any:
    if isinstance(t, torch.Tensor) and t.dtype == torch.float32:
        return t.to(torch.bfloat16).to(torch.float32)
    return t


def bf16_gate(model: nn.Module) -> None:
    """Plant a gate computed in bf16 where its code keeps float32: each layer's router runs
    under :class:`Bf16Kernels`, its outputs stored as its code says."""
    for layer in model.model.layers:
        gate = layer.mlp.gate
        original = gate.forward

        def forward_in_bf16(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            with Bf16Kernels():
                return _original(*args, **kwargs)

        gate.forward = forward_in_bf16


def mixed(
    kind: str, fault: Callable[[nn.Module], None] | None = None, train: bool = False
) -> Workload:
    """One forward (``train``: a training step) of a tiny HF model of ``kind`` stored in
    bf16 on the actual side (an ``emu:bf16-mixed`` device keeps the code's float32 islands,
    the router's among them)."""

    def run(side: Side) -> None:
        model = hf_model(kind)
        model.train(train)
        if side.actual:
            model = model.to(torch.bfloat16)
        if side.fault and fault is not None:
            fault(model)
        if train:
            with side.numerics(), side.monitor(model, backward=True):
                model(**batch()).loss.backward()
            return
        with side.numerics(), side.monitor(model), torch.no_grad():
            model(input_ids=batch()["input_ids"])

    what = "training step" if train else "forward"
    run.__doc__ = f"one {what} of a tiny {kind} stored in bf16"
    return run


def _gates(full: bool, lvl: str) -> list[Case]:
    """Issue 37: a router computed in bf16 where its code keeps float32 (DeepSeek-V3's
    float32 logits and sigmoid, Mixtral's float32 softmax), on a mixed-precision device
    that keeps the code's float32 islands: named at the gate from its weights, which its
    own logits do not give in float32 (compare/router_precision.py). Full tensors only:
    statistics do not hold the logits and weights whole."""
    if not full:
        return []
    cases: list[Case] = []
    for kind in ("deepseek-v3", "mixtral"):
        for train in (False, True):
            step = " training step" if train else ""
            cases += [
                Case(
                    f"{kind}{step} bf16-mixed [{lvl}]",
                    mixed(kind, train=train),
                    full,
                    device="emu:bf16-mixed",
                ),
                Case(
                    f"{kind}{step} bf16-mixed, fault gate computed in bf16 [{lvl}]",
                    mixed(kind, bf16_gate, train),
                    full,
                    device="emu:bf16-mixed",
                    expect="layers.0.mlp.gate",
                    fast=kind == "deepseek-v3" and not train,
                ),
            ]
    # routers whose code computes in bf16 (their weights stored in bf16) or keeps float32
    # elsewhere: clean on the mixed-precision device too
    for kind in ("gpt-oss", "qwen3-moe", "mixtral-batched"):
        cases.append(Case(f"{kind} bf16-mixed [{lvl}]", mixed(kind), full, device="emu:bf16-mixed"))
    return cases


def _controls(full: bool, lvl: str, faults: bool) -> list[Case]:
    """Stacks without a router (issue 37): Qwen2-VL, Gemma2's soft-capping, Qwen3's q/k
    norm, llama3 rope scaling; clean, and with a planted 3 % fault (Gemma2's only with
    ``faults``: behind its post-feedforward norm, statistics do not tell 3 %)."""
    cases = [
        Case(f"qwen2-vl image+text bf16 [{lvl}]", vision_language(), full),
        Case(
            f"qwen2-vl fault 3% down_proj [{lvl}]",
            vision_language(1.03),
            full,
            expect="layers.1.mlp.down_proj",
        ),
    ]
    for kind in ("gemma2", "qwen3", "llama3-rope"):
        cases += [
            Case(f"{kind} bf16 [{lvl}]", forward(kind), full),
            Case(f"{kind} training step bf16 [{lvl}]", training_step(kind), full),
        ]
        if faults or kind != "gemma2":
            cases.append(
                Case(
                    f"{kind} fault 3% down_proj [{lvl}]",
                    forward(kind, lambda m: scale_output(m.model.layers[1].mlp.down_proj, 1.03)),
                    full,
                    expect="layers.1.mlp.down_proj",
                )
            )
    return cases


CORPUS: list[Case] = _cases()


def run_case(case: Case, tmp: Path) -> Outcome:
    """Record both sides of ``case`` under ``tmp``, compare them and judge the verdict."""
    start = time.perf_counter()
    slug = "".join(c if c.isalnum() else "-" for c in case.name)
    golden = Side(tmp / slug / "golden", actual=False, full=True, fault=False)
    actual = Side(
        tmp / slug / "actual", actual=True, full=case.full, fault=case.expect is not None,
        device=case.device,
    )  # fmt: skip
    try:
        case.workload(golden)
        try:
            case.workload(actual)
        except precguard.PrecguardError as exc:
            # monitor's refusal is a verdict of its own (a model compiled before monitor)
            text = f"refused: {exc}"
            ok = bool(case.refusal_text) and all(s in text for s in case.refusal_text)
            return Outcome(case, "refused", 2, None, text, ok, time.perf_counter() - start)
        result = precguard.compare_runs(golden.out, actual.out)
    except Exception as exc:
        text = "".join(traceback.format_exception_only(exc)).strip()
        return Outcome(case, "error", -1, None, text, False, time.perf_counter() - start)
    first = result.first_divergence
    named = first.module if first is not None else None
    exit_code = 1 if result.verdict != "match" else 0
    if not exit_code and result.coverage is not None and not result.coverage.complete:
        exit_code = 3
    gaps = result.coverage.gaps if result.coverage is not None else []
    text = " ".join([first.reason if first is not None else "", *gaps, *result.warnings])
    if case.expect_text and case.expect is None and not case.must_match:
        ok = all(s in text for s in case.expect_text)
    elif case.expect is None and exit_code == 3 and case.partial_text:
        ok = all(s in text for s in case.partial_text)
    elif case.expect is None:
        ok = exit_code == 0 and all(s in text for s in case.expect_text)
    else:
        ok = exit_code == 1 and named is not None and case.expect in named
    return Outcome(case, result.verdict, exit_code, named, text, ok, time.perf_counter() - start)
