"""The backend interface a device plugin implements, and helpers for writing one.

A backend is what precguard needs from one device: whether it can be used
here (and why not), synchronisation, seeding and RNG state of the device's
own generator, a determinism switch that restores what it changed, the
environment fingerprint, moving a tensor to host memory before it is saved,
device state worth keeping after each step, and the context the model runs in
(:meth:`Backend.numerics`, which the ``emu:`` emulator uses to intercept ops).
Plugins hand precguard their backend classes through the
``precguard_register_backends`` hook; precguard builds ``Backend(device)``.

>>> class ChipBackend(Backend):                  # doctest: +SKIP
...     device_type = "chip"
...     def availability(self):
...         return (False, "chip_sdk is not installed") if sdk is None else (True, "")
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from precguard._logging import get_logger

logger = get_logger(__name__)


def parse_device(device: str) -> tuple[str, int | None]:
    """Split ``"npu:1"`` into ``("npu", 1)`` and ``"npu"`` into ``("npu", None)``.

    The part after the colon of ``emu:PROFILE`` is not an index; ask for the
    type only (``device.split(":", 1)[0]``) there.
    """
    kind, sep, rest = device.partition(":")
    if sep and rest.isdigit():
        return kind, int(rest)
    return kind, None


def env_facts(names: Iterable[str]) -> dict[str, str | None]:
    """Return ``{"env.NAME": value or None}`` for each variable, unset ones included.

    Listing unset variables too makes two fingerprints comparable: a variable
    set on one machine and absent on the other shows up as a difference.
    """
    return {f"env.{name}": os.environ.get(name) for name in names}


def read_flag(getter: Callable[[], Any]) -> bool | int | float | str | None:
    """Return a vendor flag's value for a fingerprint, or None when reading it fails.

    Flags move between SDK versions; a fingerprint must never break on a missing
    one. Bytes (what C-level option getters such as torch_npu's return) are
    decoded as UTF-8; other non-scalar values are recorded as their ``str``.

    >>> read_flag(lambda: torch.backends.cuda.matmul.allow_tf32)   # doctest: +SKIP
    False
    """
    try:
        value = getter()
    except Exception:
        return None
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return value if isinstance(value, (bool, int, float, str, type(None))) else str(value)


def torch_facts() -> dict[str, Any]:
    """Return the facts of torch itself that change numerics on every device.

    precguard puts them into every fingerprint, whatever the device, next to
    the backend's own facts (:meth:`Backend.fingerprint`).
    """
    return {
        "torch.version": torch.__version__,
        "torch.deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "torch.deterministic_algorithms_warn_only": (
            torch.is_deterministic_algorithms_warn_only_enabled()
        ),
        "torch.float32_matmul_precision": torch.get_float32_matmul_precision(),
        "torch.default_dtype": str(torch.get_default_dtype()),
    }


def device_fingerprint(backend: Backend | None) -> dict[str, Any]:
    """Return torch's facts and ``backend``'s (None: torch's only), sorted by key.

    A backend whose fingerprint raises is reported under ``fingerprint.error``
    and logged: the fingerprint is evidence, so a broken one must be visible,
    not fatal.
    """
    facts = torch_facts()
    try:
        facts.update(backend.fingerprint() if backend is not None else {})
    except Exception as exc:
        cause = f"{type(backend).__name__}.fingerprint raised {type(exc).__name__}: {exc}"
        facts["fingerprint.error"] = cause
        logger.error("fingerprint_failed", device=backend.device, cause=cause)
    return dict(sorted(facts.items()))


@contextlib.contextmanager
def scoped_env(values: Mapping[str, str | None]) -> Iterator[None]:
    """Set (or with None, unset) environment variables; restore the previous values on exit."""
    before = {name: os.environ.get(name) for name in values}
    try:
        for name, value in values.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- precguard's own tensor work -----------------------------------------------------------
# Op-intercepting modes (the ``emu:`` emulator, a user's dispatch mode) ask
# :func:`in_capture` to let precguard's statistics through unchanged; capture marks its
# work with :func:`capture_scope`. Here, below both, so that neither imports the other.


class CaptureDepth(threading.local):
    """How deep precguard's own tensor work is nested on this thread (0: none)."""

    depth = 0


#: the thread's depth of precguard's own tensor work (capture reads it without a call)
CAPTURE_DEPTH = CaptureDepth()


def in_capture() -> bool:
    """Return True while precguard computes statistics on this thread.

    Op-intercepting modes (the ``emu:`` emulator, a user's dispatch mode)
    check this to let precguard's own reductions through unchanged.
    """
    return CAPTURE_DEPTH.depth > 0


@contextlib.contextmanager
def capture_scope() -> Iterator[None]:
    """Mark precguard's own tensor work on this thread (see :func:`in_capture`)."""
    CAPTURE_DEPTH.depth += 1
    try:
        yield
    finally:
        CAPTURE_DEPTH.depth -= 1


class GemmPrecision(threading.local):
    """The dtype Linear layers' GEMMs compute in on this thread, when below the run's.

    An fp8 ``emu:`` profile sets it while its mode is active (``float8_e4m3fn``);
    capture writes it as the ``compute_dtype`` of the records a Linear computes, so
    compare judges them by the fp8 GEMM's expected error. None: the run's own.
    """

    dtype: str | None = None


#: the thread's low-precision GEMM dtype (capture reads it without a call)
GEMM_PRECISION = GemmPrecision()


class Backend:
    """What precguard needs from a device. Subclass it in a device plugin.

    The defaults suit a device whose tensors torch handles natively and whose
    generator ``torch.manual_seed`` reaches; override what differs.
    ``device`` is the string the user asked for (``"cuda:1"``).
    """

    #: device type this backend serves, e.g. ``"cuda"``
    device_type: str = ""

    def __init__(self, device: str) -> None:
        self.device = device

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.device!r})"

    def availability(self) -> tuple[bool, str]:
        """Return ``(usable, reason)``; reason says why not, e.g. "torch_npu is not installed"."""
        return True, ""

    def torch_device(self) -> torch.device:
        """Return the torch device that tensors and models are moved to."""
        return torch.device(self.device)

    def model_dtype(self) -> torch.dtype | None:
        """Return the dtype models are cast to on this device when the user names none.

        None means float32. An emulated mixed-precision chip returns its storage dtype.
        """
        return None

    def compute_dtype(self) -> torch.dtype | str | None:
        """Return the precision float ops compute in when it is lower than their storage dtype.

        None (the default) means values are as precise as the dtype they are stored
        in. An emulator storing float32 while rounding every op to bf16 returns
        ``torch.bfloat16``; a vendor plugin returns the precision its switches
        silently compute fp32 matmuls in: a torch dtype, or ``"tfloat32"``/``"hfloat32"``
        for TF32 and Ascend's HF32. Compare judges the run by this precision.
        """
        return None

    def synchronize(self) -> None:
        """Wait for queued work on the device to finish."""

    def manual_seed(self, seed: int) -> None:
        """Seed torch's CPU generator and this device's generators with ``seed``.

        This is the one call that makes a run on this device repeat itself:
        on several accelerators ``torch.manual_seed`` alone does not reach
        the device's generator.
        """
        torch.manual_seed(seed)

    def get_rng_state(self) -> torch.Tensor:
        """Return this device's generator state as a CPU uint8 tensor."""
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore this device's generator state from :meth:`get_rng_state`."""
        torch.set_rng_state(state)

    @contextlib.contextmanager
    def deterministic(self) -> Iterator[None]:
        """Turn on deterministic algorithms for this device; restore the previous flags after."""
        before = torch.are_deterministic_algorithms_enabled()
        warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
        torch.use_deterministic_algorithms(True)
        try:
            yield
        finally:
            torch.use_deterministic_algorithms(before, warn_only=warn_only)

    def fingerprint(self) -> dict[str, Any]:
        """Return the device's numerics-relevant facts (versions, flags, env vars).

        Flat dotted keys with JSON values; see :func:`env_facts` for variables.
        torch's own facts (:func:`torch_facts`) are added by precguard for every
        device: list only what is this device's. Reading must change nothing.
        """
        return {}

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """Return a plain, contiguous CPU copy of ``tensor``, one of this device's.

        Called for every tensor a recording saves. Override it for devices whose
        tensors need converting first (internal formats, special layouts).
        """
        return tensor.detach().to("cpu", copy=True).contiguous()

    def vendor_state(self, step: int, out_dir: Path) -> dict[str, Any] | None:
        """Return device state worth keeping after ``step`` ended, or None.

        :param step: the 0-based step that just ended.
        :param out_dir: a directory of this backend's own inside the recording
            (``RUN/rank{R}/vendor/{device_type}/``) for larger files; it may not
            exist yet, so create it before writing.
        :return: a small JSON-serialisable mapping (e.g. ``{"overflow_flag": True}``
            for a chip in saturation mode, where overflow is only visible in a
            status register), which precguard appends to ``RUN/rank{R}/vendor.jsonl``
            with the step; or None when there is nothing to keep.
        """
        return None

    @contextlib.contextmanager
    def numerics(self) -> Iterator[None]:
        """Context in which the model runs with this device's numerics (emulators use it)."""
        yield


class Switch:
    """A device setting a plugin declares as a remedy (``precguard_register_switches``).

    ``compare --verify`` re-runs the whole actual side with it and reports whether
    the output error falls to the floor of a correct run. A switch either runs the
    model on another device string (``instead``: another ``emu:`` profile, a vendor
    precision mode spelled as a device) or inside a context manager (``apply()``:
    a vendor flag set and restored, e.g. a high-precision matmul mode).

    :param name: unique id, ``plugin-what`` (``emu-fp32-accumulate``).
    :param devices: glob patterns (``fnmatch``) of the device strings it applies to.
    :param summary: what the switch does, in the user's words ("accumulate in fp32").
    :param instead: the device string to run on instead, or None.
    :param apply: a factory of the context manager that sets the switch, or None.
    """

    def __init__(
        self,
        name: str,
        devices: Iterable[str],
        summary: str,
        *,
        instead: str | None = None,
        apply: Callable[[], contextlib.AbstractContextManager[Any]] | None = None,
    ) -> None:
        if (instead is None) == (apply is None):
            raise ValueError(f"switch {name!r}: give exactly one of instead= and apply=")
        self.name = name
        self.devices = tuple(devices)
        self.summary = summary
        self.instead = instead
        self.apply = apply

    def applies_to(self, device: str) -> bool:
        """True when ``device`` matches one of :attr:`devices`."""
        from fnmatch import fnmatchcase

        return any(fnmatchcase(device, pattern) for pattern in self.devices)

    def __repr__(self) -> str:
        how = f"instead={self.instead!r}" if self.instead else "apply=..."
        return f"Switch({self.name!r}, {list(self.devices)!r}, {how})"
