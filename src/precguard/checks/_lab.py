"""The shared experiment bench of one checklist run.

Every check works on *copies* of the user's model: the reference copy is built
once (seeded, on the CPU, fp32) and cached in ``ctx.cache``; a check that
needs to change weights, dtypes or modes takes :meth:`Lab.copy`. Nothing here
ever alters a model the user handed in.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn

from precguard import tree
from precguard._logging import get_logger
from precguard.backend import Backend
from precguard.capture.hooks import on_calls
from precguard.checks._nonfinite import NonFiniteWatch, watch_nonfinite
from precguard.checks._trace import shared_watch
from precguard.checks.base import CheckContext, NotApplicable
from precguard.devices import dtype_name, seed_everything
from precguard.numerics import measure
from precguard.opcheck.measure import cast_floats, probe_compute_dtype, run_on_device
from precguard.target import Target, call_model
from precguard.target_run import Side, TargetRun

logger = get_logger(__name__)

On = Literal["device", "reference", "fp64"]


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """``(path, leaf)`` pairs of a nested value (:func:`precguard.tree.leaves`), mapping keys
    sorted: ``.key`` for a mapping's entries, ``[i]`` for a sequence's."""
    return [
        (
            prefix + "".join(f"[{k}]" if isinstance(k, int) else f".{k}" for k in keys) or "value",
            leaf,
        )
        for keys, leaf in tree.leaves(value, sort_keys=True)
    ]


def logits_of(output: Any) -> torch.Tensor:
    """The main tensor of a model output, as HF returns outputs.

    ``.logits`` (a ``ModelOutput``) or a mapping's ``logits``; else the first floating
    tensor that is not a scalar (``(loss, logits)``, HF's ``return_dict=False``: a
    loss computed inside ``forward`` comes first and is not the logits); else the
    first floating tensor, or the output itself.
    """
    if isinstance(output, torch.Tensor):
        return output
    logits = getattr(output, "logits", None)
    if logits is None and tree.is_mapping(output):
        logits = output.get("logits")
    if isinstance(logits, torch.Tensor):
        return logits
    floating = [t for t in tree.tensors(output) if t.is_floating_point()]
    found = next((t for t in floating if t.dim() > 0), first_tensor(output))
    if found is None:
        raise NotApplicable(f"the model output ({type(output).__name__}) holds no floating tensor")
    return found


def loss_of(output: Any) -> torch.Tensor | None:
    """The loss a model computed inside ``forward``, as HF returns it, or None.

    ``.loss`` (a ``ModelOutput``) or a mapping's ``loss``; in a tuple or list, a
    floating scalar next to a larger tensor (``(loss, logits)``).
    """
    if isinstance(output, torch.Tensor):
        return None
    loss = getattr(output, "loss", None)
    if loss is None and tree.is_mapping(output):
        loss = output.get("loss")
    if isinstance(loss, torch.Tensor) and loss.is_floating_point() and loss.numel() == 1:
        return loss
    if isinstance(output, (tuple, list)):
        floating = [t for t in output if isinstance(t, torch.Tensor) and t.is_floating_point()]
        scalars = [t for t in floating if t.numel() == 1]
        if len(scalars) == 1 and any(t.dim() > 0 and t.numel() > 1 for t in floating):
            return scalars[0]
    return None


#: apply a function to every tensor of a nested value, containers kept
map_tensors = tree.map_tensors


def rel_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Relative L2 error of ``actual`` against ``expected`` (fp64,
    :func:`precguard.numerics.measure`); inf when ``actual`` is not finite."""
    if not bool(torch.isfinite(actual).all()):
        return math.inf
    return measure(actual, expected).rel_l2


class Lab:
    """Models, batches and captured inputs shared by the checks of one run.

    Get it with :func:`lab`; it is cached in ``ctx.cache["lab"]``.
    """

    def __init__(self, ctx: CheckContext) -> None:
        if ctx.target is None or ctx.side is None or ctx.reference_side is None:
            raise NotApplicable("no target given")
        self.ctx = ctx
        #: the device under test and the reference, as the user said them
        self.side: Side = ctx.side
        #: the set-up every command shares (``Side.open()``), on the device and the reference
        self.run: TargetRun = ctx.side.open()
        self.reference_run: TargetRun = ctx.reference_side.open()
        self.target: Target = self.run.target
        self.device: Backend = self.run.backend
        self.reference: Backend = self.reference_run.backend
        self.dtype: torch.dtype = self.run.dtype
        self._cache: dict[str, Any] = {}

    # -- facts -------------------------------------------------------------

    @property
    def compute_dtype(self) -> torch.dtype:
        """The lowest precision the device computes in: the model dtype or the emulated one."""
        if "compute_dtype" not in self._cache:
            probed = probe_compute_dtype(self.device)
            choices = [self.dtype, probed]
            self._cache["compute_dtype"] = max(choices, key=lambda d: torch.finfo(d).eps)
        return self._cache["compute_dtype"]

    @property
    def measured_compute_dtype(self) -> torch.dtype | None:
        """:attr:`compute_dtype` if a check has measured it, else None (never probes)."""
        return self._cache.get("compute_dtype")

    @property
    def cname(self) -> str:
        """:attr:`compute_dtype` without the ``torch.`` prefix, for messages."""
        return dtype_name(self.compute_dtype)

    @property
    def eps(self) -> float:
        """Machine epsilon of :attr:`compute_dtype`."""
        return float(torch.finfo(self.compute_dtype).eps)

    @property
    def dev(self) -> torch.device:
        """The torch device of the device under test."""
        return self.device.torch_device()

    # -- models ------------------------------------------------------------

    def reference_model(self) -> nn.Module:
        """The model built once from the target's seed on the CPU in fp32, in eval mode.

        Seeded like every other build of the run (:meth:`build_fresh`) and never
        sent to the reference device and back: on a GPU reference that would copy
        every weight twice. The device side's ``prepare`` alters it once, so every
        copy (device, reference, fp64) carries it, as bisect's two copies do.
        Shared: never modify it; take :meth:`copy` instead.
        """
        if "reference_model" not in self._cache:
            built = self.run.prepared(self.build_fresh(self.reference))
            model = built.to(device="cpu", dtype=torch.float32)
            model.eval()
            self._cache["reference_model"] = model
        return self._cache["reference_model"]

    def copy(self, on: On = "device") -> nn.Module:
        """A private copy of the reference model placed for ``on`` (device, reference, fp64)."""
        model = copy.deepcopy(self.reference_model())
        if on == "device":
            return model.to(device=self.dev, dtype=self.dtype)
        if on == "fp64":
            return model.to(dtype=torch.float64)
        return model.to(device=self.reference.torch_device())

    def build_fresh(self, backend: Backend) -> nn.Module:
        """Seed through ``backend`` and build a brand-new model (for init experiments)."""
        run = self.reference_run if backend is self.reference else self.run
        if backend is not run.backend:  # another backend (an init experiment's own)
            run = TargetRun(self.target, run.device, backend, run.dtype)
        return run.construct()

    # -- data --------------------------------------------------------------

    def batch(self, step: int = 0) -> Any:
        """The target's batch for ``step`` on the CPU (cached: the same object every time)."""
        key = f"batch{step}"
        if key not in self._cache:
            seed_everything(self.reference, self.target.seed)
            self._cache[key] = self.target.batch(step)
        return self._cache[key]

    def place(self, batch: Any, on: On) -> Any:
        """Move a CPU batch where ``on`` runs (fp64 casts floating inputs)."""
        if on == "device":
            return cast_floats(self.run.move(batch), self.dtype)
        if on == "fp64":
            return cast_floats(batch, torch.float64)
        return self.reference_run.move(batch)

    @contextlib.contextmanager
    def numerics(self, on: On) -> Iterator[None]:
        """The numerics context of the device or the reference; nothing for fp64."""
        if on == "fp64":
            yield
        else:
            with (self.device if on == "device" else self.reference).numerics():
                yield

    def forward(
        self,
        model: nn.Module,
        on: On,
        batch: Any | None = None,
        *,
        grad: bool = False,
        inner: contextlib.AbstractContextManager[Any] | None = None,
    ) -> Any:
        """Run ``model`` on ``batch`` (default: batch 0) with the numerics of ``on``.

        ``inner`` is entered inside the numerics context (an op watcher there
        sees the device's results).
        """
        placed = self.place(self.batch(0) if batch is None else batch, on)
        ctx = contextlib.nullcontext() if grad else torch.no_grad()
        with ctx, self.numerics(on), inner or contextlib.nullcontext():
            out = call_model(model, placed)
        (self.device if on == "device" else self.reference).synchronize()
        return out

    def output(self, on: On) -> Any:
        """The model's output on batch 0 with the numerics of ``on``, no grad: one run per side.

        Every check that needs the plain forward of one side (the logits' range,
        the loss the model computes, the base of a reduction-order comparison)
        reads this one, run once per checklist run and kept; the output is shared,
        so a check copies what it changes.
        """
        key = f"output:{on}"
        if key not in self._cache:
            self._cache[key] = (
                self.forward(self.copy(on), on) if on == "fp64" else self._observed(on)
            )
        return self._cache[key]

    def _observed(self, on: On) -> Any:
        """The plain forward of ``on``, traced into an op graph and under the shared watches.

        The graph (``op_graph:ON``, :mod:`precguard.checks._graphs`) and each shared
        watch's records (:meth:`watched`, :data:`~precguard.checks._trace.SHARED_WATCHES`)
        come from this one run, so the checks that need them share it. Instrumentation
        never changes what the model computes; if it fails, the plain forward runs
        alone and those checks run their own.
        """
        from precguard.graph.build import trace_graph

        model = self.copy(on)
        watch, records = shared_watch(model, on)  # type: ignore[arg-type]
        out: list[Any] = []
        try:
            graph = trace_graph(model, lambda: out.append(self.forward(model, on, inner=watch)))
        except Exception as exc:  # the checks that read the graph or a watch trace their own
            logger.info(
                "shared_forward_not_observed", side=on, error=f"{type(exc).__name__}: {exc}"
            )
            return self.forward(self.copy(on), on)
        self._cache[f"op_graph:{on}"] = graph
        for name, found in records.items():
            self._cache[f"watched:{name}:{on}"] = found
        return out[0]

    def watched(self, name: str, on: Literal["device", "reference", "oracle"]) -> list | None:
        """What the shared watch ``name`` recorded in the shared forward of ``on``, or None.

        ``device``/``reference``: :meth:`output`'s run; None when it could not be
        observed (the check runs its own watched forward). ``oracle``: one forward
        of batch 0 under the fp64 oracle (:func:`precguard.oracle.run_in_fp64`) on
        the shared reference model; an oracle that fails raises its error to every
        check that asks.
        """
        if on != "oracle":
            self.output(on)
            return self._cache.get(f"watched:{name}:{on}")
        if "oracle_watched" not in self._cache:
            from precguard.oracle import run_in_fp64

            def run(model: nn.Module, batch: Any) -> Any:
                watch, records = shared_watch(model, "oracle")
                with watch or contextlib.nullcontext():
                    call_model(model, batch)
                return records

            try:
                # the shared CPU fp32 reference, not an fp64 copy: each op widens what it reads
                found = run_in_fp64(
                    run, self.batch(0), module=self.reference_model(), copy_module=False
                )
            except Exception as exc:
                found = exc
            self._cache["oracle_watched"] = found
        found = self._cache["oracle_watched"]
        if isinstance(found, Exception):
            raise found
        return found.get(name)

    def reference_logits(self) -> torch.Tensor:
        """Logits (main output) of the reference model on batch 0, fp32."""
        if "reference_logits" not in self._cache:
            self._cache["reference_logits"] = logits_of(self.output("reference")).detach().cpu()
        return self._cache["reference_logits"]

    def gradients(self, on: On, scale: float = 1.0) -> Gradients:
        """Loss and parameter gradients of one backward on batch 0 (cached per ``on``/``scale``).

        The model copy is in eval mode (no dropout, so device and reference see the
        same function); the loss is multiplied by ``scale`` before backward (loss
        scaling) and the gradients divided by it afterwards. Each parameter's
        gradient norm is exact; its values are kept (fp64, on the CPU) for the
        first :data:`GRAD_SAMPLE` elements, which bounds memory on large models.
        """
        key = f"grads:{on}:{scale}"
        if key not in self._cache:
            if self.target.loss is None:
                raise NotApplicable(f"target {self.target.name!r} gives no loss (Target(loss=...))")
            model = self.copy(on)
            model.eval()
            batch = self.place(self.batch(0), on)
            # the device's unscaled backward is the one grads.nonfinite_origin reads: watched
            watched = on == "device" and scale == 1.0
            watch = watch_nonfinite(model) if watched else contextlib.nullcontext()
            with self.numerics(on), watch as seen:
                out = call_model(model, batch)
                loss = self.target.loss(out, batch)
                (loss * scale).backward()
            if watched:
                self._cache["nonfinite_watch"] = seen
            sample: dict[str, torch.Tensor] = {}
            norms: dict[str, float] = {}
            for name, p in model.named_parameters():
                if not p.requires_grad:
                    continue
                if p.grad is None:
                    sample[name] = torch.zeros(min(p.numel(), GRAD_SAMPLE), dtype=torch.float64)
                    norms[name] = 0.0
                    continue
                g = p.grad.detach()
                norms[name] = float(g.double().norm()) / scale
                sample[name] = g.flatten()[:GRAD_SAMPLE].to("cpu", torch.float64) / scale
            self._cache[key] = Gradients(float(loss.detach()), sample, norms)
            del model
        return self._cache[key]

    def nonfinite_watch(self) -> NonFiniteWatch:
        """Where NaN/Inf first appeared in the device's unscaled forward and backward.

        Seen by hooks on the very run :meth:`gradients` keeps for ``("device", 1.0)``:
        one forward and backward serve the gradient checks and this one.
        """
        self.gradients("device")
        return self._cache["nonfinite_watch"]

    def training_gradients(self, on: On) -> Gradients:
        """Gradients as the target's training computes them on ``on``.

        With a ``grad_scaler`` factory on the target, the loss is scaled by the
        scaler's initial scale as :meth:`scaled_gradients` does; otherwise unscaled.
        """
        scale = declared_loss_scale(self.target) if on == "device" else None
        if scale is None:
            return self.gradients(on)
        return self.scaled_gradients(scale)[0]

    def scaled_gradients(self, scale: float, max_skips: int = 8) -> tuple[Gradients, float, int]:
        """Device gradients with the loss scaled by ``scale``, as a dynamic scaler finds them.

        After each overflow (non-finite gradients) the scale is halved, at most
        ``max_skips`` times. Returns the gradients, the last scale tried and the
        number of overflow skips.
        """
        grads = self.gradients("device", scale)
        skips = 0
        while not grads.finite and skips < max_skips:
            skips += 1
            scale /= 2
            grads = self.gradients("device", scale)
        return grads, scale, skips

    def module_inputs(self) -> dict[str, tuple[nn.Module, tuple, dict]]:
        """Inputs of each module's first call in a forward of batch 0 on the CPU in fp32.

        Maps qualified name -> (module of the reference model, args, kwargs), for
        the modules checks re-run alone: leaf modules that are the model's own
        code or norms, and rotary embeddings. Once the captures pass
        :data:`CAPTURE_BUDGET` bytes, only the first module of each class is
        kept (on a large model, layer 0's RMSNorm stands for the others). The
        hooks sit on the shared reference model for this one call only and
        return nothing, so the forward is unchanged.
        """
        if "module_inputs" not in self._cache:
            model = self.reference_model()
            captured: dict[str, tuple[nn.Module, tuple, dict]] = {}
            classes: set[type] = set()
            used = [0]

            def pre(name: str, m: nn.Module, args: tuple, kwargs: dict) -> None:
                if name in captured:
                    return
                if used[0] > CAPTURE_BUDGET and type(m) in classes:
                    return
                a, k = _detach(args), _detach(kwargs)
                used[0] += sum(t.numel() * t.element_size() for _, t in _tensors(a, k))
                classes.add(type(m))
                captured[name] = (m, a, k)

            # a capture that fails is an error of the check: it would run on missing inputs
            with (
                on_calls(
                    model,
                    pre,
                    modules=lambda _name, mod: _worth_capturing(mod),
                    errors="raise",
                ),
                torch.no_grad(),  # on the CPU in fp32: the captures are the exact inputs
            ):
                call_model(model, self.batch(0))
            self._cache["module_inputs"] = {(k or "root"): v for k, v in captured.items()}
        return self._cache["module_inputs"]

    def embedding_size(self) -> int | None:
        """Rows of the model's input embedding, if it has one."""
        model = self.reference_model()
        get = getattr(model, "get_input_embeddings", None)
        emb = get() if callable(get) else None
        if emb is None:
            emb = next((m for m in model.modules() if isinstance(m, nn.Embedding)), None)
        return int(emb.num_embeddings) if emb is not None else None

    def max_positions(self) -> int | None:
        """The model's maximum sequence length from its config, if it says."""
        config = getattr(self.reference_model(), "config", None)
        for attr in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
            value = getattr(config, attr, None)
            if isinstance(value, int) and value > 0:
                return value
        return None

    def tokenizer(self) -> Any:
        """The target's tokenizer (built once), or NotApplicable when it has none."""
        if self.target.tokenizer is None:
            raise NotApplicable(
                f"target {self.target.name!r} gives no tokenizer (Target(tokenizer=...))"
            )
        if "tokenizer" not in self._cache:
            self._cache["tokenizer"] = self.target.tokenizer()
        return self._cache["tokenizer"]


#: bytes of captured module inputs after which only one module per class is kept
CAPTURE_BUDGET = 1 << 30

#: torch's own normalisation modules (norm checks also find others by name and behaviour)
NORM_TYPES: tuple[type[nn.Module], ...] = (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)


def is_custom(module: nn.Module) -> bool:
    """True for modules whose class is not torch's own (``torch.nn.*``)."""
    return not type(module).__module__.startswith("torch.")


def _worth_capturing(mod: nn.Module) -> bool:
    """Leaf modules of the model's own code or norms, and anything named rotary/RoPE."""
    cls = type(mod).__name__.lower()
    if "rotary" in cls or "rope" in cls:
        return True
    if any(True for _ in mod.children()):
        return False
    return is_custom(mod) or isinstance(mod, NORM_TYPES)


def _tensors(*values: Any) -> list[tuple[str, torch.Tensor]]:
    return [(p, t) for v in values for p, t in flatten(v) if isinstance(t, torch.Tensor)]


def _detach(value: Any) -> Any:
    return map_tensors(value, lambda t: t.detach().clone())


#: gradient elements kept per parameter for element-wise comparisons
GRAD_SAMPLE = 65536


@dataclass(frozen=True)
class Gradients:
    """One backward's loss, exact per-parameter gradient norms, and a sample of the values."""

    loss: float
    sample: dict[str, torch.Tensor]
    norms: dict[str, float]

    @property
    def finite(self) -> bool:
        """True when the loss and every gradient norm are finite."""
        return math.isfinite(self.loss) and all(math.isfinite(n) for n in self.norms.values())

    @property
    def total_norm(self) -> float:
        """The global gradient norm (what clip_grad_norm_ measures)."""
        return math.sqrt(sum(n * n for n in self.norms.values()))


def declared_loss_scale(target: Target) -> float | None:
    """Initial scale of the target's ``grad_scaler`` factory; None without one or disabled."""
    factory = getattr(target, "grad_scaler", None)
    if factory is None:
        return None
    scaler = factory()
    if hasattr(scaler, "is_enabled") and not scaler.is_enabled():
        return None
    return float(scaler.get_scale()) if hasattr(scaler, "get_scale") else 2.0**16


def lab(ctx: CheckContext) -> Lab:
    """The :class:`Lab` of this run (created on first use)."""
    bench = ctx.cache.get("lab")
    if bench is None:
        bench = Lab(ctx)
        ctx.cache["lab"] = bench
    return bench


def run_module(
    module: nn.Module,
    args: tuple,
    kwargs: dict,
    *,
    dtype: torch.dtype,
    device: torch.device,
    numerics: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
) -> Any:
    """Run a private copy of ``module`` at ``dtype`` on ``device`` with the given numerics.

    op-check's :func:`~precguard.opcheck.measure.run_on_device`, so checks and
    op-check run a module on the device the same way.
    """
    return run_on_device(module, args, kwargs, dtype=dtype, device=device, numerics=numerics)


def first_tensor(value: Any) -> torch.Tensor | None:
    """The first floating tensor in a nested output (mapping keys sorted: ``logits``
    before ``loss``), or None."""
    return tree.first_tensor(value, sort_keys=True)
