"""precguard plugin for the imaginary Lumen accelerator (device type ``lum``)."""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from precguard import Backend, hookimpl
from precguard.backend import env_facts

if TYPE_CHECKING:  # checks are imported only when a checklist asks for them
    from precguard.checks.base import Check, CheckContext, Finding


def _sdk() -> Any:
    try:
        return importlib.import_module("lumen_sdk")  # imported only when the device is used
    except ImportError:
        return None


class LumenBackend(Backend):
    device_type = "lum"

    def availability(self) -> tuple[bool, str]:
        return (True, "") if _sdk() is not None else (False, "lumen_sdk is not installed")

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)
        _sdk().seed_all(seed)  # the chip's own generator

    def fingerprint(self) -> dict[str, Any]:
        sdk = _sdk()
        # env_facts lists unset variables too (as None), so two machines compare
        return {
            "lumen.sdk_version": getattr(sdk, "__version__", None),
            **env_facts(["LUMEN_FAST_MATH"]),
        }


@hookimpl
def precguard_register_backends(register: Callable[[type[Backend]], None]) -> None:
    register(LumenBackend)  # precguard builds LumenBackend("lum:1") for devices of type "lum"


def fast_math(ctx: CheckContext) -> Finding:
    from precguard.checks.base import Finding

    if ctx.device.split(":")[0] != "lum":
        return Finding(id="env.lumen_fast_math", status="skip", summary="not a Lumen device")
    on = os.environ.get("LUMEN_FAST_MATH") == "1"
    return Finding(
        id="env.lumen_fast_math",
        status="warn" if on else "pass",
        summary="fast math approximates exp and rsqrt" if on else "fast math is off",
        evidence={"env.LUMEN_FAST_MATH": os.environ.get("LUMEN_FAST_MATH")},
        remedy="Unset LUMEN_FAST_MATH for parity runs." if on else "",
    )


@hookimpl
def precguard_register_checks(register: Callable[[Check], None]) -> None:
    from precguard.checks.base import Check

    register(Check("env.lumen_fast_math", "Fast math is off.", fast_math, needs_target=False))
