"""How a user hands a model, its data and optionally a tokenizer to the CLI.

A target is named as ``path/to/file.py:function``, ``package.module:function``
(the function defaults to ``target``) or a built-in name (``tiny-llama``).
The function takes no arguments and returns a :class:`Target`.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from precguard import tree
from precguard.errors import TargetError

#: built-in target name -> "module:function"
BUILTIN_TARGETS: dict[str, str] = {
    "tiny-llama": "precguard.targets:tiny_llama",
    "handwritten-llama": "precguard.targets:handwritten_llama",
    "handwritten-llama-rope-bug": "precguard.targets:handwritten_llama_rope_bug",
    "parallel-decoder": "precguard.targets:parallel_decoder",
    "parallel-decoder-qk-fp16": "precguard.targets:parallel_decoder_qk_fp16",
    "parallel-decoder-norm-low-precision": "precguard.targets:parallel_decoder_norm_low_precision",
    "parallel-decoder-loss-low-precision": "precguard.targets:parallel_decoder_loss_low_precision",
    "parallel-decoder-step": "precguard.targets:parallel_decoder_step",
    "parallel-decoder-cache-fp16": "precguard.targets:parallel_decoder_cache_fp16",
}


@dataclass
class Target:
    """Factories for everything a precguard command needs to run the user's model.

    :param model: builds the model (on the CPU, in fp32; precguard seeds
        first, then moves it to the device and dtype asked for).
    :param batch: ``step -> model input``: a tensor is passed as ``model(x)``,
        a tuple as ``model(*t)``, a mapping as ``model(**m)``. Build it on the
        CPU with a seeded generator so every device sees the same data.
    :param loss: ``(output, batch) -> scalar tensor``; needed for training.
    :param optimizer: ``params -> torch.optim.Optimizer`` (default: SGD, lr 1e-3).
    :param tokenizer: builds a tokenizer with ``encode``/``decode`` (HF style).
    :param texts: sample texts for tokenizer checks.
    :param seed: the seed every run starts from.

    >>> def target() -> precguard.Target:        # doctest: +SKIP
    ...     return precguard.Target(model=build_model, batch=lambda step: make_ids(step))
    """

    model: Callable[[], nn.Module]
    batch: Callable[[int], Any]
    loss: Callable[[Any, Any], torch.Tensor] | None = None
    optimizer: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None
    tokenizer: Callable[[], Any] | None = None
    texts: list[str] = field(default_factory=list)
    seed: int = 0
    name: str = ""


def load_target(spec: str | Target) -> Target:
    """Resolve a target spec (built-in name, ``file.py:fn`` or ``pkg.mod:fn``) to a Target.

    Raises :class:`~precguard.errors.TargetError` with one line saying what went wrong.
    """
    if isinstance(spec, Target):
        return spec
    resolved = BUILTIN_TARGETS.get(spec, spec)
    module_part, _, func_name = resolved.partition(":")
    func_name = func_name or "target"
    if module_part.endswith(".py") or "/" in module_part or module_part.startswith("."):
        module = _import_file(Path(module_part), spec)
    else:
        if not module_part.replace(".", "").replace("_", "").isalnum():
            raise TargetError(
                f"unknown target {spec!r}: not a built-in ({', '.join(BUILTIN_TARGETS)}), "
                "a path/file.py[:function] or a package.module[:function]"
            )
        try:
            module = importlib.import_module(module_part)
        except ImportError as exc:
            raise TargetError(
                f"unknown target {spec!r}: cannot import module {module_part!r} ({exc}); "
                f"built-in targets: {', '.join(BUILTIN_TARGETS)}"
            ) from exc
    func = getattr(module, func_name, None)
    if not callable(func):
        raise TargetError(f"target {spec!r}: {module_part} has no function {func_name!r}")
    try:
        target = func()
    except (Exception, SystemExit) as exc:  # sys.exit() in a target is its error, not ours
        raise TargetError(f"target {spec!r}: {func_name}() {raised(exc)}") from exc
    if not isinstance(target, Target):
        raise TargetError(
            f"target {spec!r}: {func_name}() returned {type(target).__name__}, "
            "expected precguard.Target"
        )
    if not target.name:
        target.name = spec
    return target


def raised(exc: BaseException) -> str:
    """How user code ended: ``raised ValueError: ...``, or ``called sys.exit(2)``."""
    if isinstance(exc, SystemExit):
        return f"called sys.exit({exc.code!r})"
    return f"raised {type(exc).__name__}: {exc}"


def _import_file(path: Path, spec: str) -> Any:
    if not path.is_file():
        raise TargetError(f"target {spec!r}: no such file {path}")
    mod_name = f"precguard_target_{abs(hash(str(path.resolve())))}"
    loader_spec = importlib.util.spec_from_file_location(mod_name, path)
    if loader_spec is None or loader_spec.loader is None:
        raise TargetError(f"target {spec!r}: cannot load {path} as Python")
    module = importlib.util.module_from_spec(loader_spec)
    sys.modules[mod_name] = module
    # As `python file.py` does: the file's folder comes first on sys.path, so
    # the target imports the modules beside it (at import time and later, when
    # its factories run).
    folder = str(path.resolve().parent)
    if folder not in sys.path:
        sys.path.insert(0, folder)
    try:
        loader_spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:
        sys.modules.pop(mod_name, None)
        raise TargetError(f"target {spec!r}: importing {path} {raised(exc)}") from exc
    return module


def call_model(model: nn.Module, batch: Any) -> Any:
    """Call ``model`` with ``batch`` following the Target convention.

    A tensor is the one positional argument, a tuple the positional arguments,
    any mapping (a dict, a transformers ``BatchEncoding``) the keyword arguments;
    anything else is passed as it is.
    """
    if isinstance(batch, torch.Tensor):
        return model(batch)
    if isinstance(batch, tuple):
        return model(*batch)
    if tree.is_mapping(batch):
        return model(**batch)
    return model(batch)


def move_batch(batch: Any, device: torch.device) -> Any:
    """Move every tensor in ``batch`` to ``device``, keeping its containers' types.

    A ``BatchEncoding`` comes back as one (see :func:`precguard.tree.map_tensors`).
    """
    return tree.map_tensors(batch, lambda t: t.to(device))
