"""Replay the first real divergence layer by layer: teacher-forced, under ``monitor``, compared.

On each side the tokens before the divergent step go into the cache uninstrumented;
the one forward that produced the divergent logits runs under :func:`precguard.monitor`,
and :func:`precguard.compare_runs` names the first layer that diverges at that token
(docs/generate.md, "Layerwise replay").
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


@contextlib.contextmanager
def origin_events_at_debug() -> Iterator[None]:
    """Inside, the capture logs where NaN/Inf first appeared at debug level, not as a warning.

    The replay's comparison already holds the record's ``nonfinite_origin`` mark; the
    capture's own warning would be a stray line in the middle of generate-diff's report,
    so it is kept for ``--log-level debug``.
    """
    log = logging.getLogger("precguard.capture.recording")  # the capture's own

    def demote(record: logging.LogRecord) -> bool:
        if getattr(record, "precguard_event", None) != "nonfinite_origin":
            return True
        record.levelno, record.levelname = logging.DEBUG, "DEBUG"
        return log.isEnabledFor(logging.DEBUG)

    log.addFilter(demote)
    try:
        yield
    finally:
        log.removeFilter(demote)


def record_replay(side: DecodeSide, ids: torch.Tensor, out: Path, *, prefix: int) -> None:
    """Record the forward of ``ids[:, prefix:]`` after ``ids[:, :prefix]`` is in the cache."""
    import precguard

    step = side.step_fn()
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
    """Replay prompt ``index`` up to ``step`` on both sides and compare the recordings
    (:func:`precguard.compare_runs`).

    ``actual`` may be a recording made earlier (a saved run's ``layerwise/``).
    ``keep`` is a directory to keep the recordings in (``golden/``, ``actual/``);
    by default they live in a temporary directory removed afterwards.
    """
    from precguard import compare_runs

    ids, prefix = replay_ids(prompt, golden_tokens, step)
    with contextlib.ExitStack() as stack:
        if keep is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="precguard-gen-")))
        else:
            root = Path(keep)
            root.mkdir(parents=True, exist_ok=True)
        record_replay(golden, ids, root / "golden", prefix=prefix)
        if not isinstance(actual, Path):
            record_replay(actual, ids, root / "actual", prefix=prefix)
            actual = root / "actual"
        result = compare_runs(root / "golden", actual)
        dumped = result.model_dump(mode="json")
    first = dumped.get("first_divergence")
    module = (first or {}).get("module")
    logger.info(
        "layerwise_replayed", prompt=index, step=step, verdict=result.verdict, module=module
    )
    return Layerwise(
        prompt=index,
        step=step,
        position=int(ids.shape[1]) - 1,
        verdict=str(result.verdict),
        first_divergence=first,
        comparison=dumped,
        recordings=[str(root / "golden"), str(actual)] if keep is not None else None,
    )
