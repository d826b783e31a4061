"""``compare --replay``: confirm compare's suspects by replaying each one alone.

compare infers that a module made error of its own from its input and
output errors in the two runs. Replaying the module on the actual's device,
fed the golden's recorded inputs, measures that local error directly: the
decisive test. The code replayed is the target the user names; it is never
taken from a recording.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from precguard._logging import get_logger
from precguard.compare.hints import replay_spots, unreplayable
from precguard.compare.render import format_number
from precguard.compare.report import Comparison, ReplayCheck
from precguard.compare.tolerance import PROFILES
from precguard.errors import PrecguardError

logger = get_logger(__name__)


def replay_suspects(result: Comparison, *, target: str, top: int = 3) -> Comparison:
    """Replay the first divergence and the suspects (at most ``top``) of ``result``.

    Each runs alone on the actual's device and dtype with the golden's inputs,
    built from ``target``. A module that cannot be replayed (no full tensors,
    a decorated function, an error building the target) gets a note instead.
    Returns ``result`` with :attr:`Comparison.replays` filled in.

    >>> checked = replay_suspects(precguard.compare_runs(g, a), target="model.py")  # doctest: +SKIP
    >>> [(r.module, r.verdict, r.local_error) for r in checked.replays]        # doctest: +SKIP
    [('model.layers.1.mlp.down_proj', 'diverged', 0.00099)]
    """
    from precguard.localize.replay import replay_module
    from precguard.target_run import Side

    device = result.devices[1] if len(result.devices) > 1 else "cpu"
    dtype = result.dtypes[1] if len(result.dtypes) > 1 else None
    actual = Side(target, device, dtype) if target else None  # rebuilt from ``target``
    # a named fixed profile judges the replays too; the default judges each by the error
    # a correct module explains at the replay's precision
    profile = result.profile if result.profile in PROFILES and result.profile != "default" else None
    checks: list[ReplayCheck] = []
    for spot in replay_spots(result, top):
        base = {
            "module": spot.module,
            "module_type": spot.module_type,
            "key": spot.key,
            "step": spot.step,
            "rank": spot.rank,
            "call": spot.call,
            "inferred_local": spot.local,
            "inferred_error": spot.error,
            "amplification": spot.amplification,
            "device": device,
            "dtype": dtype,
        }
        why = unreplayable(result, spot)
        if why is not None:
            checks.append(ReplayCheck(**base, replayed=False, note=why))
            continue
        try:
            replay = replay_module(
                result.golden,
                spot.module,
                target=actual,
                call=spot.call,
                step=spot.step,
                rank=spot.rank,
                profile=profile,
            )
        except PrecguardError as exc:
            logger.warning("replay_failed", module=spot.module, error=str(exc))
            checks.append(ReplayCheck(**base, replayed=False, note=str(exc)))
            continue
        checks.append(
            ReplayCheck(
                **base | {"dtype": replay.dtype},
                replayed=True,
                verdict=replay.verdict,
                local_error=replay.local_error,
                note="; ".join(replay.warnings),
            )
        )
    return result.model_copy(update={"replays": checks})


def render_replays(result: Comparison, console: Console) -> None:
    """Print the replay table: compare's inferred error beside the measured local error."""
    if not result.replays:
        console.print("[dim]replay: no forward module made error of its own; nothing to replay[/]")
        return
    device = result.replays[0].device
    table = Table(
        title=f"replayed alone on {device} with the golden's inputs", title_justify="left"
    )
    for col in ("module", "inferred", "replay", "local error", "agrees"):
        table.add_column(col, overflow="fold")
    for r in result.replays:
        inferred = (
            "local" if r.inferred_local else "propagated"
        ) + f", error {format_number(r.inferred_error)}"
        if r.amplification is not None:
            inferred += f", {format_number(r.amplification)}x"
        if not r.replayed:
            table.add_row(r.module, inferred, Text("not run", style="yellow"), "-", "-")
            continue
        style = "bold red" if r.verdict == "diverged" else "green"
        agrees = (r.verdict == "diverged") == bool(r.inferred_local)
        table.add_row(
            r.module,
            inferred,
            Text(r.verdict or "-", style=style),
            format_number(r.local_error),
            Text("yes" if agrees else "NO", style="green" if agrees else "bold yellow"),
        )
    console.print(table)
    for r in result.replays:
        if r.note:
            label = "not replayed: " if not r.replayed else "note: "
            console.print(Text.assemble((label, "yellow"), f"{r.module}: {r.note}"))
