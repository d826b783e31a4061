"""The CUDA backend: availability, seeding, determinism and the numerics fingerprint."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

import torch

from precguard.backend import Backend, env_facts, parse_device, read_flag, scoped_env

#: environment variables that change numbers (or their reproducibility) on NVIDIA GPUs
CUDA_ENV: tuple[str, ...] = (
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "CUDA_LAUNCH_BLOCKING",
    "CUDA_VISIBLE_DEVICES",
    "NCCL_ALGO",
    "NCCL_PROTO",
)


class CudaBackend(Backend):
    """One NVIDIA GPU, through torch's own CUDA support (no extra SDK)."""

    device_type = "cuda"

    def availability(self) -> tuple[bool, str]:
        """Usable when torch has CUDA, a GPU is visible and the index exists."""
        if not torch.backends.cuda.is_built():
            return False, f"torch {torch.__version__} was built without CUDA"
        if not torch.cuda.is_available():
            return False, "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)"
        _, index = parse_device(self.device)
        count = torch.cuda.device_count()
        if index is not None and index >= count:
            return False, f"{self.device} requested but only {count} CUDA device(s) are visible"
        return True, ""

    def synchronize(self) -> None:
        """Wait for this GPU's queued kernels."""
        torch.cuda.synchronize(self.torch_device())

    def manual_seed(self, seed: int) -> None:
        """Seed the CPU generator and every GPU's generator."""
        torch.manual_seed(seed)
        torch.cuda.manual_seed_all(seed)

    def get_rng_state(self) -> torch.Tensor:
        """This GPU's generator state."""
        return torch.cuda.get_rng_state(self.torch_device())

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Restore this GPU's generator state."""
        torch.cuda.set_rng_state(state, self.torch_device())

    @contextlib.contextmanager
    def deterministic(self) -> Iterator[None]:
        """Deterministic algorithms, deterministic cuDNN without autotuning, and a fixed
        cuBLAS workspace; everything restored on exit.

        ``CUBLAS_WORKSPACE_CONFIG`` only takes effect before the first cuBLAS
        call of the process: set it in the environment for full effect.
        """
        cudnn = torch.backends.cudnn
        before = (cudnn.deterministic, cudnn.benchmark)
        workspace = (
            {}
            if os.environ.get("CUBLAS_WORKSPACE_CONFIG")
            else {"CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
        )
        with scoped_env(workspace), super().deterministic():
            cudnn.deterministic = True
            cudnn.benchmark = False
            try:
                yield
            finally:
                cudnn.deterministic, cudnn.benchmark = before

    def compute_dtype(self) -> str | None:
        """``"tfloat32"`` when fp32 matmuls run as TF32, else None.

        ``torch.backends.cuda.matmul.allow_tf32`` (set by
        ``torch.set_float32_matmul_precision("high"/"medium")`` or by
        ``matmul.fp32_precision = "tf32"``) makes cuBLAS round fp32 matmul operands
        to 10 mantissa bits: a run in fp32 is then only as precise as TF32, and
        compare judges it so. Convolutions (``cudnn.allow_tf32``) are not counted:
        the models precguard targets are matmul-bound.
        """
        return "tfloat32" if read_flag(lambda: torch.backends.cuda.matmul.allow_tf32) else None

    def fingerprint(self) -> dict[str, Any]:
        """Versions, TF32 and reduced-precision switches, cuDNN flags, SDPA backends, env."""
        cuda = torch.backends.cuda
        cudnn = torch.backends.cudnn
        facts: dict[str, Any] = {
            "cuda.available": self.availability()[0],
            "cuda.torch_cuda_version": torch.version.cuda,
            "cuda.cudnn_version": read_flag(cudnn.version),
            "cuda.matmul.allow_tf32": read_flag(lambda: cuda.matmul.allow_tf32),
            "cuda.matmul.fp32_precision": read_flag(lambda: cuda.matmul.fp32_precision),
            "cuda.matmul.allow_fp16_reduced_precision_reduction": read_flag(
                lambda: cuda.matmul.allow_fp16_reduced_precision_reduction
            ),
            "cuda.matmul.allow_bf16_reduced_precision_reduction": read_flag(
                lambda: cuda.matmul.allow_bf16_reduced_precision_reduction
            ),
            "cuda.matmul.allow_fp16_accumulation": read_flag(
                lambda: cuda.matmul.allow_fp16_accumulation
            ),
            "cuda.cudnn.enabled": read_flag(lambda: cudnn.enabled),
            "cuda.cudnn.allow_tf32": read_flag(lambda: cudnn.allow_tf32),
            "cuda.cudnn.deterministic": read_flag(lambda: cudnn.deterministic),
            "cuda.cudnn.benchmark": read_flag(lambda: cudnn.benchmark),
            "cuda.sdp.flash": read_flag(cuda.flash_sdp_enabled),
            "cuda.sdp.mem_efficient": read_flag(cuda.mem_efficient_sdp_enabled),
            "cuda.sdp.math": read_flag(cuda.math_sdp_enabled),
            "cuda.sdp.cudnn": read_flag(cuda.cudnn_sdp_enabled),
        }
        if facts["cuda.available"]:
            dev = self.torch_device()
            facts["cuda.device_name"] = read_flag(lambda: torch.cuda.get_device_name(dev))
            facts["cuda.capability"] = read_flag(
                lambda: ".".join(map(str, torch.cuda.get_device_capability(dev)))
            )
        facts.update(env_facts(CUDA_ENV))
        return facts
