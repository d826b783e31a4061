"""The Ascend NPU backend: availability, seeding, determinism and the numerics fingerprint."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from precguard.backend import Backend, env_facts, parse_device, read_flag, scoped_env
from precguard_ascend import sdk

#: environment variables that change numbers (or their reproducibility) on Ascend
ASCEND_ENV: tuple[str, ...] = (
    "INF_NAN_MODE_ENABLE",
    "INF_NAN_MODE_FORCE_DISABLE",
    "HCCL_DETERMINISTIC",
    "ASCEND_LAUNCH_BLOCKING",
    "TORCH_NPU_FALLBACK_CPU_DISABLE",
    "TORCH_NPU_USE_COMPATIBLE_IMPL",
    "TORCH_NPU_LEGACY_IMPL_LIST",
    "CLOSE_MATMUL_K_SHIFT",
    "ASCEND_RT_VISIBLE_DEVICES",
)

#: torch_npu formats a CPU tensor can mirror directly (NCHW, NHWC, ND, NDHWC, NCDHW)
PLAIN_FORMATS = frozenset({0, 1, 2, 27, 30})
FORMAT_ND = 2


class AscendBackend(Backend):
    """One Ascend NPU through ``torch_npu`` (imported lazily)."""

    device_type = "npu"

    def availability(self) -> tuple[bool, str]:
        """Usable when torch_npu imports, an NPU is visible and the index exists."""
        npu = sdk.torch_npu()
        if npu is None:
            return False, sdk.NOT_INSTALLED
        version = getattr(npu, "__version__", "?")
        if not read_flag(npu.npu.is_available):
            return False, (
                f"torch_npu {version} is installed but no NPU is visible "
                "(check the driver, CANN and ASCEND_RT_VISIBLE_DEVICES)"
            )
        _, index = parse_device(self.device)
        count = read_flag(npu.npu.device_count) or 0
        if index is not None and index >= count:
            return False, f"{self.device} requested but only {count} NPU(s) are visible"
        return True, ""

    def _sdk(self) -> Any:
        npu = sdk.torch_npu()
        if npu is None:
            from precguard.errors import DeviceUnavailableError

            raise DeviceUnavailableError(
                f"device {self.device!r} is unavailable: {sdk.NOT_INSTALLED}"
            )
        return npu

    def torch_device(self) -> torch.device:
        """The ``npu`` torch device (torch_npu registers the type on import)."""
        self._sdk()
        return torch.device(self.device)

    def synchronize(self) -> None:
        """Wait for the NPU's queued work."""
        self._sdk().npu.synchronize()

    def manual_seed(self, seed: int) -> None:
        """Seed the CPU generator and every NPU's generator (torch_npu.npu.manual_seed_all)."""
        torch.manual_seed(seed)
        self._sdk().npu.manual_seed_all(seed)

    def get_rng_state(self) -> torch.Tensor:
        """This NPU's generator state."""
        return self._sdk().npu.get_rng_state(self.device)

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore this NPU's generator state."""
        self._sdk().npu.set_rng_state(state, self.device)

    @contextlib.contextmanager
    def deterministic(self) -> Iterator[None]:
        """Deterministic ACL ops and HCCL collectives; restored on exit.

        Through ``torch_npu.npu.set_deterministic_level`` only: it sets torch's
        deterministic flag itself, and torch_npu warns against calling
        ``torch.use_deterministic_algorithms`` directly. The level to restore
        is read from torch's flag, which torch_npu keeps in step with it:
        ``_get_deterministic_level()`` may call the setter, so it is not asked.
        An SDK without ``set_deterministic_level`` gets torch's own switch.

        ``HCCL_DETERMINISTIC`` is read when communicators are created: set it in
        the environment before ``init_process_group`` for full effect.
        """
        npu = self._sdk()
        set_level = getattr(npu.npu, "set_deterministic_level", None)
        with scoped_env({"HCCL_DETERMINISTIC": "true"}):
            if set_level is None:
                with super().deterministic():
                    yield
                return
            before = 1 if torch.are_deterministic_algorithms_enabled() else 0
            set_level(1)
            try:
                yield
            finally:
                set_level(before)

    def compute_dtype(self) -> str | None:
        """The precision fp32 matmuls compute in under the precision switches, or None.

        Read from the same facts as the fingerprint (reading changes nothing):
        see :func:`matmul_precision`.
        """
        return matmul_precision(self.fingerprint())

    def fingerprint(self) -> dict[str, Any]:
        """torch_npu version, HF32, precision/impl modes, overflow mode, formats, env.

        Reading changes nothing on the device. ACL options torch_npu has not
        set read as ``"unset"`` (the chip's default applies); None means the
        value could not be read. Whether deterministic algorithms are on is in
        torch's part of the fingerprint (``torch.deterministic_algorithms``):
        torch_npu's ``set_deterministic_level`` sets that flag, and its
        ``_get_deterministic_level`` may call the setter, so it is not read.
        """
        facts: dict[str, Any] = {}
        npu = sdk.torch_npu()
        usable, reason = self.availability()
        facts["npu.available"] = usable
        if not usable:
            facts["npu.unavailable_reason"] = reason
        facts["npu.torch_npu_version"] = getattr(npu, "__version__", None) if npu else None
        keys = (
            "npu.matmul.allow_hf32",
            "npu.conv.allow_hf32",
            "npu.matmul.cube_math_type",
            "npu.precision_mode",
            "npu.op_select_impl_mode",
            "npu.inf_nan_mode",
            "npu.allow_internal_format",
            "npu.jit_compile",
            "npu.device_name",
        )
        facts.update(dict.fromkeys(keys))
        if npu is not None:
            mod = npu.npu
            inf_nan = read_flag(lambda: mod.utils.is_support_inf_nan())
            jit_false = read_flag(mod.is_jit_compile_false)
            facts.update(
                {
                    "npu.matmul.allow_hf32": read_flag(lambda: mod.matmul.allow_hf32),
                    "npu.conv.allow_hf32": read_flag(lambda: mod.conv.allow_hf32),
                    "npu.matmul.cube_math_type": read_flag(lambda: mod.matmul.cube_math_type),
                    "npu.precision_mode": sdk.get_option(npu, "ACL_PRECISION_MODE"),
                    "npu.op_select_impl_mode": sdk.get_option(npu, "ACL_OP_SELECT_IMPL_MODE"),
                    "npu.inf_nan_mode": None if inf_nan is None else bool(inf_nan),
                    "npu.allow_internal_format": read_flag(
                        lambda: mod.config.allow_internal_format
                    ),
                    "npu.jit_compile": None if jit_false is None else not jit_false,
                }
            )
            if usable:
                _, index = parse_device(self.device)
                facts["npu.device_name"] = read_flag(lambda: mod.get_device_name(index or 0))
        facts.update(env_facts(ASCEND_ENV))
        return facts

    def to_host(self, tensor: torch.Tensor) -> torch.Tensor:
        """Copy an NPU tensor to the CPU, casting internal formats (NZ, 5HD...) to ND first."""
        npu = self._sdk()
        t = tensor.detach()
        fmt = read_flag(lambda: npu.get_npu_format(t))
        if fmt is not None and fmt not in PLAIN_FORMATS:
            t = npu.npu_format_cast(t, FORMAT_ND)
        return t.to("cpu").contiguous()

    def vendor_state(self, step: int, out_dir: Path) -> dict[str, Any] | None:
        """In saturation mode, read and clear the float-status overflow flag; else None.

        Saturation clamps overflow to ±max and NaN to 0, so the flag register is
        the only sign that a step overflowed.
        """
        npu = sdk.torch_npu()
        if npu is None or not self.availability()[0]:
            return None
        utils = npu.npu.utils
        if read_flag(utils.is_support_inf_nan):
            return None  # INF_NAN mode: overflow shows up as inf/NaN in the records
        flag = read_flag(lambda: utils.npu_check_overflow(0.0))
        with contextlib.suppress(Exception):
            npu.npu.clear_npu_overflow_flag()
        return {"inf_nan_mode": False, "overflow_flag": None if flag is None else bool(flag)}


#: ACL_PRECISION_MODE values under which fp32 cube (matmul) ops compute in a lower dtype
_PRECISION_MODE_DTYPES = {
    "allow_fp32_to_fp16": "float16",
    "force_fp16": "float16",
    "allow_mix_precision": "float16",
    "allow_mix_precision_fp16": "float16",
    "allow_mix_precision_bf16": "bfloat16",
    "force_lowerprecision": "float16",
}
#: cube_math_type (``torch.npu.matmul.cube_math_type``), by name or by aclnn's cubeMathType
#: code (0 KEEP_DTYPE, 1 ALLOW_FP32_DOWN_PRECISION, 2 USE_FP16, 3 USE_HF32); ALLOW_FP32_DOWN
#: lets the kernel choose, so it is not counted
_CUBE_MATH_DTYPES: dict[str | int, str] = {
    "USE_FP16": "float16",
    "USE_HF32": "hfloat32",
    2: "float16",
    3: "hfloat32",
}


def matmul_precision(facts: dict[str, Any]) -> str | None:
    """The precision fp32 matmuls compute in, from Ascend fingerprint facts; None: fp32.

    The least precise of: the ACL precision mode (``allow_fp32_to_fp16``, the
    default before the 910B chips, runs fp32 matmuls in fp16; an unset mode on a
    910A-class chip counts as that default), the cube math type (``USE_FP16``,
    ``USE_HF32``) and ``torch.npu.matmul.allow_hf32`` (HF32: fp32's range, 11
    mantissa bits). Unreadable facts count as not lowering precision.
    """
    found: list[str] = []
    mode = facts.get("npu.precision_mode")
    if mode == "unset":
        name = str(facts.get("npu.device_name") or "")
        if name.startswith("Ascend910") and not name.startswith(("Ascend910B", "Ascend910_93")):
            mode = "allow_fp32_to_fp16"
    if isinstance(mode, str) and mode in _PRECISION_MODE_DTYPES:
        found.append(_PRECISION_MODE_DTYPES[mode])
    cube = facts.get("npu.matmul.cube_math_type")
    cube = getattr(cube, "name", cube)  # an enum member
    cube = cube.upper() if isinstance(cube, str) else cube
    if isinstance(cube, str | int) and not isinstance(cube, bool) and cube in _CUBE_MATH_DTYPES:
        found.append(_CUBE_MATH_DTYPES[cube])
    if facts.get("npu.matmul.allow_hf32") is True:
        found.append("hfloat32")
    bits = {"bfloat16": 8, "float16": 11, "hfloat32": 12}
    return min(found, key=bits.__getitem__) if found else None
