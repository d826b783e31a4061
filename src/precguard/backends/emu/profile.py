"""Emulator profiles: what numeric behaviours an ``emu:PROFILE`` device reproduces.

A profile is a TOML file. The built-in ones live in ``profiles/`` next to
this module (``emu:fp16``, ``emu:fp16-saturate``, ...); a user passes their
own as ``emu:/path/to/chip.toml``. Unknown fields are errors, so a typo
cannot silently fall back to a default. ``docs/emu.md`` documents the format.
"""

from __future__ import annotations

import hashlib
import sys
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from precguard.errors import UsageError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 needs the backport
    import tomli as tomllib

DType = Literal["float32", "float16", "bfloat16"]

#: friendly op names accepted in ``op_dtypes``, each standing for the aten ops it runs as
OP_ALIASES: dict[str, tuple[str, ...]] = {
    "softmax": ("_softmax", "_softmax_backward_data"),
    "log_softmax": ("_log_softmax", "_log_softmax_backward_data"),
    "matmul": ("mm", "addmm", "bmm", "baddbmm"),
    "layer_norm": ("native_layer_norm", "native_layer_norm_backward"),
    "rms_norm": ("_fused_rms_norm", "_fused_rms_norm_backward"),
    "attention": (
        "_scaled_dot_product_flash_attention_for_cpu",
        "_scaled_dot_product_flash_attention_for_cpu_backward",
    ),
}

PROFILE_SCHEMA_VERSION = 1


class EmuProfileError(UsageError):
    """An ``emu:`` profile that does not exist or does not validate."""


class EmuProfile(BaseModel):
    """The numeric behaviours one emulated chip shows. Every field has a safe default."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = Field(
        PROFILE_SCHEMA_VERSION, description="Profile format version; this precguard reads 1."
    )
    name: str = Field("", description="Profile name; defaults to the file name without .toml.")
    description: str = Field("", description="One line: which chip behaviour this reproduces.")
    compute_dtype: DType = Field(
        "float32",
        description="Storage dtype of every float op: inputs and results are rounded to it; "
        "the op itself computes in float32 (as accelerators accumulate in fp32).",
    )
    overflow: Literal["inf", "saturate"] = Field(
        "inf",
        description="'inf': overflow gives ±inf (IEEE). 'saturate': results clamp to the "
        "dtype's ±max, as on chips in saturation mode.",
    )
    nan_to_zero: bool = Field(
        False, description="Replace NaN results by 0 (what saturation mode does on some chips)."
    )
    flush_to_zero: bool = Field(
        False,
        description="Flush subnormal inputs and results (below the dtype's smallest normal) to 0.",
    )
    accumulate_dtype: DType = Field(
        "float32",
        description="Dtype of the running sum in matmul (mm, addmm, bmm, baddbmm) and sum/mean: "
        "a lower one rounds the partial sum after every block.",
    )
    accumulate_block: int = Field(
        32, ge=1, description="Elements summed in float32 before the running sum is rounded."
    )
    shuffle_reductions: bool = Field(
        False,
        description="Permute the reduced dimension of matmul and sum/mean (a different "
        "reduction order, as another chip's kernels use).",
    )
    shuffle_seed: int = Field(0, ge=0, description="Seed of the reduction-order permutation.")
    rng_stream: int = Field(
        0,
        ge=0,
        description="0: random ops use torch's CPU generator. Any other value: they use the "
        "emulated device's own generator, seeded only through backend.manual_seed, with a "
        "stream that differs from the CPU's under the same seed.",
    )
    keep_float32: bool = Field(
        False,
        description="Mixed precision: ops whose float tensors are all float32 run unrounded, "
        "so a model stored in compute_dtype keeps the fp32 islands its code asks for "
        "(`x.float()` in RMSNorm, fp32 softmax, fp32 rotary angles), as on a GPU or an "
        "Ascend chip in must_keep_origin_dtype mode. The model is cast to compute_dtype "
        "unless --dtype says otherwise.",
    )
    fp8_format: Literal["none", "e4m3", "e5m2"] = Field(
        "none",
        description="Run 2-D GEMMs (mm, addmm: every Linear, forward and backward) with both "
        "operands scaled and rounded to this fp8 format (OCP e4m3fn or e5m2, saturating), "
        "accumulating in fp32; the result is rounded to compute_dtype as any op's.",
    )
    fp8_scaling: Literal["current", "delayed", "block"] = Field(
        "current",
        description="Where an fp8 operand's scale comes from: 'current' its own amax (per "
        "tensor), 'delayed' the largest amax of the last fp8_amax_history calls of the same "
        "GEMM (Transformer Engine), 'block' one scale per 1 x fp8_block activation tile and "
        "fp8_block x fp8_block weight tile (DeepSeek-V3).",
    )
    fp8_amax_history: int = Field(
        16, ge=1, description="Calls of one GEMM whose amax a delayed scale remembers."
    )
    fp8_block: int = Field(128, ge=1, description="Tile edge of block scaling.")
    fp8_scale_rounding: Literal["exact", "pow2"] = Field(
        "exact",
        description="'exact': scale = amax / fmax in fp32; 'pow2': rounded up to a power of "
        "two (E8M0 scales of the OCP MX formats).",
    )
    batch_invariant: bool = Field(
        False,
        description="Fixed-order reductions: matmul (mm, addmm, bmm, baddbmm), sum/mean and "
        "softmax add their terms one after another in index order, so a row's result does "
        "not depend on how many other rows (a batch) or leading zeros (left padding) share "
        "the op.",
    )
    split_k_rows: int = Field(
        0,
        ge=0,
        description="0: off. Otherwise a matmul of fewer rows (batch x positions) than "
        "this splits its reduced dimension in two partial sums (a split-K kernel chosen "
        "for small batches), so a row's result depends on the batch size. Implies "
        "batch_invariant's fixed order within each split.",
    )
    op_dtypes: dict[str, DType] = Field(
        default_factory=dict,
        description="Per-op storage dtype overrides: {'softmax': 'float16'}. Keys are aliases "
        "(softmax, log_softmax, matmul, layer_norm, rms_norm, attention) or aten op names.",
    )

    @field_validator("op_dtypes")
    @classmethod
    def _known_ops(cls, value: dict[str, str]) -> dict[str, str]:
        import torch

        for op in value:
            if op not in OP_ALIASES and not hasattr(torch.ops.aten, op):
                raise ValueError(
                    f"unknown op {op!r}: expected an alias ({', '.join(OP_ALIASES)}) "
                    "or an aten op name such as '_softmax' or 'mm'"
                )
        return value

    @field_validator("schema_version")
    @classmethod
    def _readable(cls, value: int) -> int:
        if value > PROFILE_SCHEMA_VERSION:
            raise ValueError(
                f"schema_version {value} is newer than this precguard reads "
                f"({PROFILE_SCHEMA_VERSION}); upgrade precguard"
            )
        return value

    def aten_dtypes(self) -> dict[str, str]:
        """Return ``op_dtypes`` with aliases expanded to aten op names."""
        out: dict[str, str] = {}
        for op, dtype in self.op_dtypes.items():
            for name in OP_ALIASES.get(op, (op,)):
                out[name] = dtype
        return out


def builtin_profiles() -> list[str]:
    """Return the names of the profiles shipped with precguard, sorted."""
    folder = resources.files("precguard.backends.emu") / "profiles"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def is_profile_path(spec: str) -> bool:
    """Return True when ``spec`` names a file rather than a built-in profile."""
    return spec.endswith(".toml") or "/" in spec or "\\" in spec


def load_profile(spec: str) -> tuple[EmuProfile, str, str]:
    """Load the profile ``spec`` (a built-in name or a TOML path).

    Returns ``(profile, source, sha256)`` where ``source`` is ``builtin:NAME``
    or the file's absolute path. Raises :class:`EmuProfileError` with one line
    saying what is wrong.
    """
    if not spec:
        raise EmuProfileError(
            f"emu needs a profile: emu:PROFILE (built-in: {', '.join(builtin_profiles())}) "
            "or emu:/path/to/profile.toml"
        )
    if is_profile_path(spec):
        path = Path(spec).expanduser()
        if not path.is_file():
            raise EmuProfileError(f"emu profile file {spec}: no such file")
        data = path.read_bytes()
        source, default_name = str(path.resolve()), path.stem
    else:
        resource = resources.files("precguard.backends.emu") / "profiles" / f"{spec}.toml"
        if not resource.is_file():
            from precguard.suggest import did_you_mean

            raise EmuProfileError(
                f"unknown emu profile {spec!r}{did_you_mean(spec, builtin_profiles())}; "
                "built-in profiles: "
                f"{', '.join(builtin_profiles())}, or pass a file: emu:/path/to/profile.toml"
            )
        data = resource.read_bytes()
        source, default_name = f"builtin:{spec}", spec
    return parse_profile(data, where=source, default_name=default_name), source, _sha256(data)


def parse_profile(data: bytes, *, where: str, default_name: str) -> EmuProfile:
    """Parse and validate TOML bytes into a profile; errors name ``where`` and the field."""
    try:
        raw = tomllib.loads(data.decode("utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise EmuProfileError(f"emu profile {where}: not valid TOML ({exc})") from exc
    raw.setdefault("name", default_name)
    try:
        return EmuProfile.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = str(err["msg"]).removeprefix("Value error, ")
        raise EmuProfileError(f"emu profile {where}: field '{loc}': {msg}") from exc


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
