"""Hand-made records, as compare pairs them, for the tests of the judge and its one pass.

A record's key (``module.call.phase.role.index``) says where it sits; its errors are the
ones a real run measured, given as both tensors compared (level ``full``).
"""

from __future__ import annotations

from precguard.compare import FullMetrics, Metrics, RecordResult


def full_record(
    key: str,
    seq: int,
    error: float,
    *,
    dtype: str = "float32",
    shape: tuple[int, ...] = (2, 16, 64),
    slice_error: float | None = None,
    peak: float | None = None,
    scale: float | None = None,
    bias: bool = False,
    module_type: str = "Module",
    status: str = "pass",
    golden_dtype: str = "float32",
    actual_dtype: str | None = None,
) -> RecordResult:
    """The record at ``key``, ``seq``-th in capture order, with relative error ``error``
    measured in ``dtype``: uniform (its worst slice and peak the same) unless ``slice_error``
    or ``peak`` say otherwise; ``scale`` with ``bias`` a systematic scale error the scale
    test found significant. ``status``: what a fixed profile's tolerance said (the default
    profile judges it anew); ``golden_dtype`` and ``actual_dtype``: the stored dtypes, where
    the rules read them (a loss kept in bfloat16)."""
    module, call, phase, role, index = key.rsplit(".", 4)
    metrics = FullMetrics(
        level="full",
        dtype=dtype,
        error=error,
        rel_l2=error,
        cosine=1.0,
        max_abs_err=error,
        slice_error=error if slice_error is None else slice_error,
        peak_error=error if peak is None else peak,
        scale=scale,
        scale_se=None if scale is None else 1e-9,
        bias=bias,
    )
    return RecordResult(
        key=key,
        module=module,
        module_type=module_type,
        call=int(call),
        index=int(index),
        step=0,
        rank=0,
        phase=phase,  # type: ignore[arg-type]
        role=role,  # type: ignore[arg-type]
        golden_dtype=golden_dtype,
        actual_dtype=actual_dtype,
        shape=list(shape),
        seq=seq,
        status=status,  # type: ignore[arg-type]
        metrics=metrics,
    )


def record_result(
    seq: int,
    metrics: Metrics | None,
    *,
    module: str,
    module_type: str,
    golden_dtype: str,
    shape: list[int],
    status: str,
    **fields: object,
) -> RecordResult:
    """The result compare keeps for ``module``'s first forward output (step 0, rank 0)."""
    return RecordResult(
        key=f"{module}.0.forward.output.0",
        module=module,
        module_type=module_type,
        call=0,
        step=0,
        rank=0,
        phase="forward",
        role="output",
        index=0,
        golden_dtype=golden_dtype,
        shape=shape,
        seq=seq,
        status=status,  # type: ignore[arg-type]
        metrics=metrics,
        **fields,  # type: ignore[arg-type]
    )
