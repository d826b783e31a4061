"""The Cambricon MLU backend: availability, seeding, determinism and the fingerprint."""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import torch

from precguard.backend import Backend, env_facts, parse_device, read_flag

NOT_INSTALLED = "torch_mlu is not installed"

#: values of ``ENABLE_FALLBACK_TO_CPU`` that turn the fallback off (unset means on)
FALLBACK_OFF = frozenset({"0", "OFF", "off"})
#: values of ``ENABLE_MLU_FAIL_FALLBACK`` that turn it on; anything else (unset too) is off
FAIL_FALLBACK_ON = frozenset({"1", "ON", "on"})

#: environment variables that change numbers (or where ops run) on Cambricon MLUs
MLU_ENV: tuple[str, ...] = (
    "TORCH_ALLOW_TF32_CNMATMUL_OVERRIDE",
    "ENABLE_FALLBACK_TO_CPU",
    "ENABLE_MLU_FAIL_FALLBACK",
    "ENABLE_MLU_OVERFLOW_CHECK",
    "MLU_VISIBLE_DEVICES",
)


def torch_mlu() -> ModuleType | None:
    """Return the ``torch_mlu`` module (importing it registers ``mlu``), or None."""
    try:
        return importlib.import_module("torch_mlu")
    except ImportError:
        return None


class CambriconBackend(Backend):
    """One Cambricon MLU through ``torch_mlu`` (imported lazily)."""

    device_type = "mlu"

    def availability(self) -> tuple[bool, str]:
        """Usable when torch_mlu imports, an MLU is visible and the index exists."""
        mlu = torch_mlu()
        if mlu is None:
            return False, NOT_INSTALLED
        if not read_flag(mlu.mlu.is_available):
            return False, (
                f"torch_mlu {getattr(mlu, '__version__', '?')} is installed but no MLU is "
                "visible (check the driver and MLU_VISIBLE_DEVICES)"
            )
        _, index = parse_device(self.device)
        count = read_flag(mlu.mlu.device_count) or 0
        if index is not None and index >= count:
            return False, f"{self.device} requested but only {count} MLU(s) are visible"
        return True, ""

    def _sdk(self) -> Any:
        mlu = torch_mlu()
        if mlu is None:
            from precguard.errors import DeviceUnavailableError

            raise DeviceUnavailableError(f"device {self.device!r} is unavailable: {NOT_INSTALLED}")
        return mlu

    def torch_device(self) -> torch.device:
        """The ``mlu`` torch device (torch_mlu registers the type on import)."""
        self._sdk()
        return torch.device(self.device)

    def synchronize(self) -> None:
        """Wait for the MLU's queued work."""
        self._sdk().mlu.synchronize()

    def manual_seed(self, seed: int) -> None:
        """Seed the CPU generator and every MLU's generator (torch_mlu.mlu.manual_seed_all)."""
        torch.manual_seed(seed)
        self._sdk().mlu.manual_seed_all(seed)

    def get_rng_state(self) -> torch.Tensor:
        """This MLU's generator state."""
        return self._sdk().mlu.get_rng_state(self.device)

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore this MLU's generator state."""
        self._sdk().mlu.set_rng_state(state, self.device)

    @contextlib.contextmanager
    def deterministic(self) -> Iterator[None]:
        """Deterministic CNNL kernels and torch's deterministic algorithms; restored on exit.

        ``torch.backends.cnnl.deterministic`` (installed by torch_mlu) selects
        deterministic CNNL kernels; torch's flag covers the ops that check it.
        """
        self._sdk()
        cnnl = getattr(torch.backends, "cnnl", None)
        before = getattr(cnnl, "deterministic", None)
        with super().deterministic():
            if cnnl is not None:
                cnnl.deterministic = True
            try:
                yield
            finally:
                if cnnl is not None:
                    cnnl.deterministic = before

    def compute_dtype(self) -> str | None:
        """``"tfloat32"`` when fp32 matmuls run as TF32 (``torch.backends.mlu.matmul.allow_tf32``).

        The flag follows ``torch.get_float32_matmul_precision()``; the CUDA flags
        are no-ops on MLU and are not read. Convolutions (``cnnl.allow_tf32``) are
        not counted: the models precguard targets are matmul-bound.
        """
        mlu = getattr(torch.backends, "mlu", None)
        return "tfloat32" if read_flag(lambda: mlu.matmul.allow_tf32) else None

    def fingerprint(self) -> dict[str, Any]:
        """torch_mlu version, TF32 and determinism switches, fallback and overflow variables."""
        mlu = torch_mlu()
        usable, reason = self.availability()
        facts: dict[str, Any] = {"mlu.available": usable}
        if not usable:
            facts["mlu.unavailable_reason"] = reason
        facts["mlu.torch_mlu_version"] = getattr(mlu, "__version__", None) if mlu else None
        backends = torch.backends
        facts.update(
            {
                # torch_mlu installs torch.backends.mlu and torch.backends.cnnl on import
                "mlu.matmul.allow_tf32": read_flag(lambda: backends.mlu.matmul.allow_tf32),
                "mlu.custom.allow_tf32": read_flag(lambda: backends.mlu.custom.allow_tf32),
                "mlu.cnnl.allow_tf32": read_flag(lambda: backends.cnnl.allow_tf32),
                "mlu.cnnl.deterministic": read_flag(lambda: backends.cnnl.deterministic),
                "mlu.device_name": None,
            }
        )
        if usable and mlu is not None:
            _, index = parse_device(self.device)
            facts["mlu.device_name"] = read_flag(lambda: mlu.mlu.get_device_name(index or 0))
        facts.update(env_facts(MLU_ENV))
        return facts
