"""Compare at scale: (rank, step) units shared by worker processes or by a torchrun job.

Comparing is independent per rank and step, so the units are dealt out and the
results merged in (rank, step) order (:func:`~precguard.compare.engine.merge_shards`):
the same JSON whatever the number of processes. ``compare_runs(..., workers=N)`` runs
this process and N-1 more on this machine; under ``torchrun ... -m precguard.compare``
every process of the job takes a share and rank 0 gathers, merges and prints. A share
travels as the JSON of its :class:`~precguard.compare.units.ShardResult`, never pickled.
Unit ``(i, s)`` belongs to process :func:`owner` (whole ranks when there are at least
as many ranks as processes). Workers keep the parent's torch thread count, so
full-tensor metrics round their last bits as a single-process run does.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_all_start_methods, get_context
from typing import Any

from precguard.compare.engine import ComparePlan, compare_shard, plan_from_arguments
from precguard.compare.units import ShardResult
from precguard.errors import PrecguardError

#: set by ``python -m precguard.compare`` under torchrun: share units with the job's ranks
_DISTRIBUTED: dict[str, Any] = {"active": False}


def raise_carried(shard: ShardResult) -> ShardResult:
    """``shard`` itself, or raise the error it carries as the process that met it did (a
    PrecguardError when its class is not one of precguard's)."""
    if shard.error is None:
        return shard
    from precguard import errors
    from precguard.compare import coverage, engine

    for module in (errors, engine, coverage):
        cls = getattr(module, shard.error, None)
        if isinstance(cls, type) and issubclass(cls, PrecguardError):
            raise cls(shard.message)
    raise PrecguardError(shard.message)


def _parse(text: str) -> ShardResult:
    return raise_carried(ShardResult.model_validate_json(text))


def owner(index: int, step: int, n_ranks: int, count: int) -> int:
    """The process (0..count-1) that compares the ``index``-th rank's ``step``."""
    k = math.ceil(count / n_ranks)
    return (index + n_ranks * (step % k)) % count


def owns_fn(plan: ComparePlan, me: int, count: int) -> Callable[[int, int], bool | None]:
    """``owns(rank, step)`` for process ``me`` of ``count`` (see engine.compare_shard)."""
    position = {r: i for i, r in enumerate(plan.ranks)}
    n = len(plan.ranks)
    k = math.ceil(count / n)

    def owns(rank: int, step: int) -> bool | None:
        i = position[rank]
        if step == -1:  # does this process hold anything of the rank; its warnings?
            mine = any(owner(i, s, n, count) == me for s in range(k))
            return owner(i, 0, n, count) == me if mine else None
        return owner(i, step, n, count) == me

    return owns


def shard_json(arguments: dict[str, Any], me: int, count: int) -> str:
    """Compare process ``me``'s share (the worker's entry point); its ShardResult as JSON.

    A :class:`PrecguardError` is returned inside the share, so the coordinator raises it
    as a single process would (:func:`raise_carried`).
    """
    return _share(lambda: plan_from_arguments(arguments), me, count)[1]


def _share(
    make_plan: Callable[[], ComparePlan], me: int, count: int
) -> tuple[ComparePlan | None, str, PrecguardError | None]:
    """(the plan, process ``me``'s share as JSON, the error met making or comparing it)."""
    try:
        plan = make_plan()
        shard = compare_shard(plan, owns_fn(plan, me, count))
    except PrecguardError as exc:
        failed = ShardResult(error=type(exc).__name__, message=str(exc))
        return None, failed.model_dump_json(exclude_defaults=True), exc
    return plan, shard.model_dump_json(exclude_defaults=True), None


def compare_shards(
    plan: ComparePlan, *, on_step: Callable[[int, int], None] | None = None
) -> list[ShardResult]:
    """Every shard of the comparison: here, or by ``plan.options.workers`` processes."""
    workers = plan.options.workers
    if workers == 1:
        return [compare_shard(plan, lambda _r, _s: True, on_unit=on_step)]
    workers = min(workers, max(1, os.cpu_count() or 1) * 4)
    context = get_context("fork" if "fork" in get_all_start_methods() else "spawn")
    # this process compares share 0 itself while the others run: one process fewer to
    # start, and one share less to send and parse
    with ProcessPoolExecutor(max_workers=workers - 1, mp_context=context) as pool:
        futures = [pool.submit(shard_json, plan.arguments, me, workers) for me in range(1, workers)]
        shards = [compare_shard(plan, owns_fn(plan, 0, workers), on_unit=on_step)]
        for future in futures:
            shard = _parse(future.result())
            if on_step is not None:
                for u in shard.units:
                    on_step(u.rank, u.step)
            shards.append(shard)
    return shards


class ShareSent(BaseException):
    """Raised by ``compare`` on a torchrun job's ranks other than 0 once their share is
    sent: not an error (rank 0 reports), a ``BaseException`` so no ``except Exception``
    swallows it before ``python -m precguard.compare`` catches it."""


def job_active() -> bool:
    """True when comparisons are shared with a torch.distributed job (see :func:`activate_job`)."""
    return bool(_DISTRIBUTED["active"])


def compare_in_job(
    make_plan: Callable[[], ComparePlan],
) -> tuple[ComparePlan, list[ShardResult]]:
    """Compare this process's share and gather every share on rank 0 (every rank reaches
    the gather, also when its plan failed: rank 0 raises the error its share carries).

    :raises ShareSent: on ranks other than 0, once their share is sent.
    """
    import torch.distributed as dist

    me, count = dist.get_rank(), dist.get_world_size()
    plan, shard, failure = _share(make_plan, me, count)
    gathered: list[Any] | None = [None] * count if me == 0 else None
    dist.gather_object(shard, gathered, dst=0)
    if me != 0:
        raise ShareSent
    if failure is not None:
        raise failure
    assert gathered is not None and plan is not None
    return plan, [_parse(t) for t in gathered]


def activate_job() -> None:
    """Share comparisons with the processes of the current torch.distributed job."""
    _DISTRIBUTED["active"] = True
