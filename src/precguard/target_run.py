"""One target made ready to run on one device: the set-up every command shares.

``precguard record``, ``replay``, ``bisect``, ``op-check`` and the checks all
start the same way: resolve the target spec, the device's backend and the
model dtype (the one asked for, else the backend's storage dtype, else
float32), build the model seeded on the CPU and move it, move each batch to
the device, and name the target's own code when it raises or calls
``sys.exit()``. :class:`TargetRun` is that set-up, written once.

:class:`Side` is what the user says about one side of a comparison (the
target, the device, the dtype, what alters the built model); ``Side.open()``
sets it up as a :class:`TargetRun`. Every entry point that runs a target
(``record_target``, ``bisect``, ``generate_diff``, ``replay_module``, ``op_check``,
``check``, the error budget's ``verify``) takes a ``Side`` and builds its model
through it; those that run a reference too take it as ``golden=``, a second Side
(:func:`golden_side`).

>>> run = TargetRun.open("tiny-llama", "emu:bf16")          # doctest: +SKIP
>>> model = run.build_model()                               # seeded, on the device
>>> out = run.forward(model, run.device_batch(0))
>>> side = Side("tiny-llama", "emu:bf16")                   # doctest: +SKIP
>>> run = side.open()                                       # the same TargetRun
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from torch import nn

from precguard import tree
from precguard.devices import construct_model, parse_dtype, resolve_backend
from precguard.errors import PrecguardError, TargetError, UsageError
from precguard.target import Target, call_model, load_target, raised

if TYPE_CHECKING:
    from precguard.backend import Backend

T = TypeVar("T")


def model_dtype(backend: Backend, dtype: str | torch.dtype | None = None) -> torch.dtype:
    """The dtype a model runs in: ``dtype`` if given, else the backend's storage dtype, or fp32."""
    requested = parse_dtype(dtype) if dtype is not None else None
    return requested or backend.model_dtype() or torch.float32


@dataclass
class TargetRun:
    """A loaded target, the backend of the device it runs on and the model dtype.

    :param target: the loaded :class:`~precguard.target.Target`.
    :param device: the device string (``"npu:1"``, ``"emu:bf16"``).
    :param backend: the usable backend of ``device``.
    :param dtype: the dtype the model and floating inputs are cast to.
    """

    target: Target
    device: str
    backend: Backend
    dtype: torch.dtype
    #: what part of the target's code is running (None: precguard's own), see :meth:`doing`
    running: str | None = field(default=None, compare=False)
    #: alters the built model before it runs (a :class:`Side`'s ``prepare``), see :meth:`prepared`
    prepare: Callable[[nn.Module], Any] | None = field(default=None, compare=False)

    @classmethod
    def open(
        cls, target: str | Target, device: str, dtype: str | torch.dtype | None = None
    ) -> TargetRun:
        """Resolve ``dtype``, ``target`` and ``device`` (in that order; each bad one is exit 2).

        ``dtype`` None means the backend's storage dtype (``emu:fp16-mixed``'s
        float16), else float32.
        """
        if dtype is not None:
            parse_dtype(dtype)  # a bad dtype is reported before the target is imported
        target_obj = load_target(target)
        backend = resolve_backend(device)
        return cls(target_obj, device, backend, model_dtype(backend, dtype))

    @classmethod
    def on(
        cls, target: str | Target, device: str, backend: Backend, dtype: torch.dtype
    ) -> TargetRun:
        """Load ``target`` to run on a ``device`` whose backend and dtype are already resolved."""
        return cls(load_target(target), device, backend, dtype)

    @property
    def name(self) -> str:
        """The target's name, as errors show it."""
        return self.target.name

    @property
    def torch_device(self) -> torch.device:
        """Where the model and batches go."""
        return self.backend.torch_device()

    # -- the target's own code -------------------------------------------------------------

    def error(self, exc: BaseException, what: str | None = None) -> TargetError:
        """The target's error for ``exc``, raised while running ``what`` (or :attr:`running`)."""
        return TargetError(f"target {self.name!r}: {what or self.running} {raised(exc)}")

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run the target's code ``fn``; its exception or ``sys.exit()`` becomes a TargetError."""
        try:
            return fn(*args, **kwargs)
        except PrecguardError:
            raise
        except (Exception, SystemExit) as exc:  # a target's sys.exit() is its error too
            raise self.error(exc, what) from exc

    @contextlib.contextmanager
    def doing(self, what: str | None) -> Iterator[None]:
        """Mark that the target's ``what`` is running, without catching anything.

        For code that must let the user's exception travel up unchanged (a
        recording names its type in the manifest) and turn it into
        :meth:`error` further out, where :attr:`running` still says what raised.
        """
        self.running = what
        yield
        self.running = None

    # -- model and data ----------------------------------------------------------------------

    def construct(self) -> nn.Module:
        """Seed everything, then build the target's model on the CPU (float32, not moved)."""
        return construct_model(self.target, self.backend)

    def build_model(self, dtype: torch.dtype | None = None) -> nn.Module:
        """Seed, build on the CPU, then move to the device in ``dtype`` (default :attr:`dtype`).

        Initialising on the CPU gives identical weights on every device.
        """
        return self.construct().to(device=self.torch_device, dtype=dtype or self.dtype)

    def prepared(self, model: nn.Module) -> nn.Module:
        """``model`` altered by :attr:`prepare` (in place; unchanged when there is none).

        Called by each feature where its set-up allows (after :meth:`build_model`, or on
        the CPU copy of :meth:`construct` when one model is copied to two devices).
        """
        if self.prepare is not None:
            self.prepare(model)
        return model

    def batch(self, step: int) -> Any:
        """The target's batch for ``step``, on the CPU as the target built it."""
        return self.call(f"batch({step})", self.target.batch, step)

    def move(self, batch: Any, device: torch.device | None = None) -> Any:
        """``batch`` with every tensor moved to ``device`` (default: this run's), types kept."""
        where = device or self.torch_device
        return tree.map_tensors(batch, lambda t: t.to(where))

    def device_batch(self, step: int) -> Any:
        """The batch for ``step``, moved to the device."""
        return self.move(self.batch(step))

    def forward(self, model: nn.Module, batch: Any, what: str = "the forward") -> Any:
        """``model`` called with ``batch`` by the target convention; a raise is the target's."""
        return self.call(what, call_model, model, batch)


#: a target as the entry points accept it: a built-in name, ``file.py:fn``, or a Target
TargetSpec = str | Target


@dataclass(frozen=True)
class Side:
    """One side of a comparison: the target, the device it runs on, the dtype, the set-up.

    The one way to say what runs where: ``precguard.record_target``,
    ``precguard.bisect``, ``precguard.generate_diff`` and ``precguard.check`` take a
    ``Side`` (their older keyword arguments ``device=``, ``dtype=``, ``prepare=``
    build one; :func:`one_side`), and the reference as a second one (``golden=``, or
    ``check``'s ``reference=``, its ``golden`` being a recording; the older
    ``reference=``, ``reference_dtype=`` build it, :func:`golden_side`);
    the CLI builds them from ``--target``/``--device``/``--dtype``/``--reference``.

    :param target: the model: a built-in target name, ``file.py:fn`` or a
        :class:`~precguard.target.Target`.
    :param device: the device string (``"cpu"``, ``"npu:1"``, ``"emu:bf16"``).
    :param dtype: the model dtype; None: the backend's storage dtype
        (``emu:fp16-mixed``'s float16), else float32.
    :param prepare: ``prepare(model)`` alters the built model before it runs (tests
        and the demo plant faults with it).

    >>> golden = precguard.Side("tiny-llama")                     # doctest: +SKIP
    >>> actual = precguard.Side("tiny-llama", "emu:bf16")         # doctest: +SKIP
    >>> precguard.generate_diff(golden=golden, actual=actual)     # doctest: +SKIP
    """

    target: TargetSpec
    device: str = "cpu"
    dtype: str | torch.dtype | None = None
    prepare: Callable[[nn.Module], Any] | None = None

    def open(self) -> TargetRun:
        """Resolve the dtype, the target and the device (each bad one is exit 2), set up."""
        run = TargetRun.open(self.target, self.device, self.dtype)
        run.prepare = self.prepare
        return run

    def replace(self, **changes: Any) -> Side:
        """A copy with ``changes`` (``side.replace(device="cpu")``)."""
        return dataclasses.replace(self, **changes)

    def open_beside(self, run: TargetRun) -> TargetRun:
        """This side set up on ``run``'s already loaded target: the golden of an entry point
        that copies one built model to both sides (bisect, the error budget, verify).

        The dtype, then the device, are resolved (each bad one is exit 2); the target is
        not loaded again (a ``file.py`` target would run its module twice), and ``run``'s
        ``prepare`` is kept: the one build both copies come from carries it.
        """
        if self.dtype is not None:
            parse_dtype(self.dtype)
        backend = resolve_backend(self.device)
        return TargetRun(
            run.target, self.device, backend, model_dtype(backend, self.dtype), prepare=run.prepare
        )


def refuse_beside(what: str, beside: str, on: str, **keywords: Any) -> None:
    """A usage error naming ``what`` when any of the older per-side ``keywords`` is set
    beside the Side that says it (``beside``: how the caller gave that Side; ``on``: where
    the keywords belong): saying one side twice is ambiguous, not merged."""
    given = [name for name, value in keywords.items() if value is not None]
    if given:
        raise UsageError(f"{what}: {', '.join(given)} given beside {beside}; set them on {on}")


def one_side(
    target: TargetSpec | Side | None,
    what: str,
    *,
    device: str | None = None,
    dtype: str | torch.dtype | None = None,
    prepare: Callable[[nn.Module], Any] | None = None,
    default_device: str | None = "cpu",
) -> Side:
    """The :class:`Side` an entry point's ``target`` and per-side keywords mean.

    ``target`` may be a Side (then the keywords must be left unset) or a target
    spec (then the keywords build the Side; ``device`` None is ``default_device``,
    and a missing one is a usage error naming ``what``).
    """
    if isinstance(target, Side):
        refuse_beside(what, "a Side", "the Side", device=device, dtype=dtype, prepare=prepare)
        return target
    if target is None:
        raise UsageError(f"{what}: no target given (pass a Side or a target)")
    where = device if device is not None else default_device
    if where is None:
        raise UsageError(f"{what}: no device given (pass a Side or device=)")
    return Side(target, where, dtype, prepare)


#: the golden's dtype when the deprecated ``reference_dtype=`` keyword is left unset: the
#: trusted reference has always been float32, whatever the golden device's storage dtype
REFERENCE_DTYPE = torch.float32


def golden_side(
    golden: Side | None,
    actual: Side,
    what: str,
    *,
    reference: str | None = None,
    reference_dtype: str | torch.dtype | None = None,
) -> Side:
    """The golden (reference) :class:`Side` of an entry point that runs ``actual``'s target
    on two sides from one build: ``bisect``, the error budget, ``verify``.

    ``golden`` given: it is the side, and the deprecated keywords ``reference=`` and
    ``reference_dtype=`` must be left unset (both forms is a usage error naming ``what``).
    Else the keywords build it: the actual's target on ``reference`` (None: ``"cpu"``) in
    ``reference_dtype`` (None: float32, the old default).

    The two sides are copies of one built model, so a golden Side names the actual's
    target (the same spec or the same :class:`~precguard.target.Target`), and its
    ``prepare`` is the actual's or None (the build carries the actual's ``prepare`` to
    both copies); anything else is a usage error saying so. Its dtype None means, as for
    every Side, the backend's storage dtype, else float32.

    >>> golden_side(None, Side("tiny-llama", "emu:bf16"), "bisect")  # doctest: +SKIP
    Side(target='tiny-llama', device='cpu', dtype=torch.float32, prepare=None)
    """
    if golden is None:
        return Side(
            actual.target,
            reference if reference is not None else "cpu",
            reference_dtype if reference_dtype is not None else REFERENCE_DTYPE,
        )
    if not isinstance(golden, Side):
        raise UsageError(
            f"{what}: golden= takes a Side, got {type(golden).__name__} "
            "(precguard.Side(target, device, dtype))"
        )
    refuse_beside(
        what,
        "golden=",
        "the golden Side",
        reference=reference,
        reference_dtype=reference_dtype,
    )
    if golden.target is not actual.target and golden.target != actual.target:
        raise UsageError(
            f"{what}: the golden Side runs {_spec(golden.target)}, the actual "
            f"{_spec(actual.target)}; {what} copies one built model to both sides"
        )
    if golden.prepare is not None and golden.prepare is not actual.prepare:
        raise UsageError(
            f"{what}: the golden Side has a prepare of its own; {what} copies one built "
            "model to both sides, so set prepare on the actual's Side (it reaches both)"
        )
    return golden


def spec_name(target: TargetSpec | Side) -> str:
    """The name a result shows for a target spec, a loaded Target or a Side's target."""
    if isinstance(target, Side):
        target = target.target
    return target if isinstance(target, str) else target.name


def _spec(target: TargetSpec) -> str:
    return repr(spec_name(target))
