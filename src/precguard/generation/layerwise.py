"""Replay the first real divergence layer by layer: teacher-forced, under ``monitor``, compared.

On each side the prompt and the golden's tokens before the divergent step are
decoded into the cache without instrumentation; the one forward that produced
the divergent step's logits (the prefill itself at step 0) then runs under
:func:`precguard.monitor` with full tensors. The two recordings hold the same
module calls on the same tokens, so :func:`precguard.compare_runs` names the
first layer that diverges *at that token*, and, because the cache the forward
reads was written by each side's own cache path, a cache fault shows in the
attention that reads it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch

from precguard._logging import get_logger
from precguard.errors import TargetError
from precguard.generation.decode import DecodeSide
from precguard.generation.report import Layerwise
from precguard.target import raised

logger = get_logger(__name__)


class _OriginAtDebug(logging.Filter):
    """Turn the capture's ``nonfinite_origin`` warning into a debug event."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "precguard_event", None) != "nonfinite_origin":
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return logging.getLogger(_CAPTURE_LOGGER).isEnabledFor(logging.DEBUG)


_CAPTURE_LOGGER = "precguard.capture.recording"


@contextlib.contextmanager
def origin_events_at_debug() -> Iterator[None]:
    """Inside, the capture logs where NaN/Inf first appeared at debug level, not as a warning.

    generate-diff's teacher-forced replay records under :func:`precguard.monitor`;
    a NaN/Inf origin there (an fp16 overflow, a ``-inf`` mask a module returns)
    is part of what the replay compares, and the comparison it reports (the
    layer line, ``layerwise.comparison`` in ``--json``) already holds the
    record's ``nonfinite_origin`` mark. The capture's own warning would be a
    stray ``warning nonfinite_origin module=...`` line in the middle of
    generate-diff's report (issue 39), so it is kept for ``--log-level debug``.
    """
    log = logging.getLogger(_CAPTURE_LOGGER)
    demote = _OriginAtDebug()
    log.addFilter(demote)
    try:
        yield
    finally:
        log.removeFilter(demote)


def record_replay(side: DecodeSide, ids: torch.Tensor, out: Path, *, prefix: int) -> None:
    """Record the forward of ``ids[:, prefix:]`` after ``ids[:, :prefix]`` is in the cache."""
    import precguard

    step = side.step_fn()
    handle = None
    try:
        with side.running():
            cache = None
            if prefix:
                _, cache = step(side.to_device(ids[:, :prefix]), None)
            handle = precguard.monitor(
                side.model,
                out,
                tensors=True,
                backward=False,
                device=side.device,
                target=side.target.name,
                compute_dtype=side.compute_dtype,
            )
            with origin_events_at_debug(), handle:  # the close flushes: inside the filter
                step(side.to_device(ids[:, prefix:]), cache)
    except (Exception, SystemExit) as exc:
        if isinstance(exc, precguard.PrecguardError):
            raise
        raise TargetError(
            f"target {side.target.name!r}: replaying the prefix on {side.device} {raised(exc)}"
        ) from exc


def replay_ids(
    prompt: torch.Tensor, golden_tokens: list[int], step: int
) -> tuple[torch.Tensor, int]:
    """The ids of the replay of ``step`` and how many of them go into the cache first."""
    ids = torch.cat([prompt, torch.tensor([golden_tokens[:step]], dtype=prompt.dtype)], dim=1)
    return ids, (ids.shape[1] - 1 if step > 0 else 0)


def compare_replays(
    golden: Path, actual: Path, *, index: int, step: int, position: int, keep: bool = False
) -> Layerwise:
    """Compare two replay recordings with :func:`precguard.compare_runs`."""
    from precguard import compare_runs

    result = compare_runs(golden, actual)
    dumped = result.model_dump(mode="json")
    logger.info(
        "layerwise_replayed",
        prompt=index,
        step=step,
        verdict=result.verdict,
        module=(dumped.get("first_divergence") or {}).get("module"),
    )
    return Layerwise(
        prompt=index,
        step=step,
        position=position,
        verdict=str(result.verdict),
        first_divergence=dumped.get("first_divergence"),
        comparison=dumped,
        recordings=[str(golden), str(actual)] if keep else None,
    )


def replay_layerwise(
    golden: DecodeSide,
    actual: DecodeSide | Path,
    prompt: torch.Tensor,
    golden_tokens: list[int],
    *,
    index: int,
    step: int,
    keep: str | os.PathLike[str] | None = None,
) -> Layerwise:
    """Replay prompt ``index`` up to ``step`` on both sides and compare the recordings.

    ``actual`` may be a recording made earlier (a saved run's ``layerwise/``).
    ``keep`` is a directory to keep the recordings in (``golden/``, ``actual/``);
    by default they live in a temporary directory removed afterwards.
    """
    ids, prefix = replay_ids(prompt, golden_tokens, step)
    with contextlib.ExitStack() as stack:
        if keep is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="precguard-gen-")))
        else:
            root = Path(keep)
            root.mkdir(parents=True, exist_ok=True)
        record_replay(golden, ids, root / "golden", prefix=prefix)
        if isinstance(actual, Path):
            actual_path = actual
        else:
            actual_path = root / "actual"
            record_replay(actual, ids, actual_path, prefix=prefix)
        return compare_replays(
            root / "golden",
            actual_path,
            index=index,
            step=step,
            position=int(ids.shape[1]) - 1,
            keep=keep is not None,
        )
