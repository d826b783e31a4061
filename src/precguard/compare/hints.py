"""compare's messages: how it explains what it found, and the ``precguard replay`` command
that confirms a suspect (the actual's target printed, never imported) or why none can be given.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from precguard.compare.align import closest_unmatched
from precguard.compare.coverage import incomplete_note
from precguard.compare.report import Comparison, FirstDivergence, RecordResult, Suspect
from precguard.compare.units import OneSided
from precguard.dump.reader import Run
from precguard.errors import PrecguardError


@dataclass(frozen=True)
class ReplayHint:
    """The command that replays the first divergence alone, or why there is none."""

    command: str | None
    reason: str = ""


@dataclass(frozen=True)
class ReplaySpot:
    """One module call to replay: where it is and what compare inferred about it."""

    module: str
    module_type: str
    key: str
    step: int
    rank: int
    call: int
    local: bool | None
    error: float
    amplification: float | None


def call_of(key: str) -> int:
    """The call index in a record key ``{module}.{call}.{phase}.{role}.{index}``."""
    parts = key.rsplit(".", 4)
    return int(parts[1]) if len(parts) == 5 and parts[1].isdigit() else 0


def _spot(r: FirstDivergence | Suspect, local: bool | None, error: float) -> ReplaySpot:
    at = (r.module, r.module_type, r.key, r.step, r.rank, call_of(r.key))
    return ReplaySpot(*at, local, error, r.amplification)


def replay_spots(result: Comparison, top: int) -> list[ReplaySpot]:
    """The first divergence and the suspects after it, forward and local, at most ``top``."""
    spots: list[ReplaySpot] = []
    fd = result.first_divergence
    if fd is not None and fd.phase == "forward" and fd.local:
        spots.append(_spot(fd, fd.local, fd.metrics.error))
    forward = {r.key for r in result.records if r.phase == "forward"}
    # a backward suspect is left out: replay runs forward only
    spots += [_spot(s, True, s.error) for s in result.suspects if s.key in forward]
    return spots[:top]


def unreplayable(result: Comparison, spot: ReplaySpot) -> str | None:
    """Why ``spot`` cannot be replayed from the golden recording, or None when it can."""
    if spot.module_type == "function":
        return (
            f"{spot.module} is a decorated function: replay runs a module of a target "
            "model and cannot import a function by its recorded name; decorate or record "
            "the module that calls it (--tensors) and replay that module"
        )
    if "#" in spot.module:
        return (
            f"{spot.module} was recorded by @precision_monitor under an instance name no "
            "target model has; record it through monitor()/precguard record to replay it"
        )
    needed = [
        r
        for r in result.records
        if r.module == spot.module
        and (r.step, r.rank, r.phase) == (spot.step, spot.rank, "forward")
        and r.role in ("input", "output")
        and call_of(r.key) == spot.call
    ]
    if not needed:  # e.g. compare --layout: records gathered at a group's first rank
        return (
            f"this comparison holds no forward inputs and outputs of {spot.module} (call "
            f"{spot.call}) at step {spot.step}, rank {spot.rank}: replay one rank's module from "
            "a recording made on that rank"
        )
    # replay needs the golden's tensors; an actual with statistics only does not matter
    unsaved = [r for r in needed if r.metrics is None or r.metrics.level not in ("full", "exact")]
    if unsaved and golden_lacks_tensors(result.golden, spot):
        return (
            f"the golden holds no full tensors of {spot.module}'s inputs and outputs; record "
            f"the golden with --tensors '{spot.module}' to replay it"
        )
    return None


def golden_lacks_tensors(golden: str, spot: ReplaySpot) -> bool:
    """Whether the golden recording lacks a full tensor of ``spot``'s forward inputs/outputs
    (True when its records cannot be read)."""
    from precguard.dump.reader import load_run

    try:
        records = load_run(golden).records(spot.rank)
        return any(
            r.tensor is None
            for r in records
            if r.module == spot.module
            and (r.step, r.phase, r.call) == (spot.step, "forward", spot.call)
            and r.role in ("input", "output")
        )
    except PrecguardError:
        return True


def target_problem(spec: str | None) -> str | None:
    """Why ``spec`` (a manifest's target) cannot be passed to --target as is, or None."""
    from precguard.target import BUILTIN_TARGETS

    if not spec:
        return (
            "the actual recording names no target (it was made with monitor(), not "
            "precguard record); replay needs one"
        )
    if spec in BUILTIN_TARGETS:
        return None
    path = spec.split(":", 1)[0]
    if path.endswith(".py"):
        return None if Path(path).is_file() else f"the actual's target file {path} is not found"
    if ":" in spec:
        return None  # package.module:function; importable or not, it is the user's to run
    return f"the actual's target {spec!r} is a name, not a file or module to pass to --target"


def replay_hint(result: Comparison) -> ReplayHint | None:
    """The ``precguard replay`` command confirming the first divergence, or why there is
    none; None when there is no local first divergence to confirm."""
    spots = replay_spots(result, 1)
    fd = result.first_divergence
    if fd is not None and fd.phase == "backward" and fd.local:
        return ReplayHint(
            None,
            "the first divergence is in backward and replay re-runs a module's forward only; "
            "the backward records of that module are the evidence",
        )
    if not spots or fd is None or spots[0].key != fd.key:
        return None
    spot = spots[0]
    target = result.targets[1] if len(result.targets) > 1 else None
    why = unreplayable(result, spot) or target_problem(target)
    if why is not None:
        return ReplayHint(None, why)
    assert target is not None
    device = result.devices[1] if len(result.devices) > 1 else "cpu"
    dtype = result.dtypes[1] if len(result.dtypes) > 1 else None
    args = ["precguard", "replay", result.golden, "--module", spot.module, "--target", target]
    args += ["--device", device, *(["--dtype", dtype] if dtype else [])]
    args += ["--call", str(spot.call), "--step", str(spot.step), "--rank", str(spot.rank)]
    return ReplayHint(shlex.join(args))


def replay_suggestion(actual_target: str | None) -> str:
    """What to tell a user who asked for ``--replay`` without ``--target``."""
    if actual_target:
        return (
            f"--replay needs --target: the code to replay is imported only when you name it; "
            f"the actual recording was made from {actual_target!r} (pass --target "
            f"{shlex.quote(actual_target)} if you trust it)"
        )
    return "--replay needs --target: the target whose code ran on the actual's side"


def closest(golden_only: list[str], actual_only: list[str]) -> str:
    """``; `` and the closest pair of unmatched names, or nothing when none is close."""
    text = closest_unmatched(golden_only, actual_only)
    return f"; {text}" if text else ""


def unmatched_warning(golden_only: list[str], actual_only: list[str]) -> str:
    """The warning that some records have no counterpart."""
    return (
        f"{len(golden_only)} golden and {len(actual_only)} actual records have no "
        "counterpart (listed under 'unmatched')" + closest(golden_only, actual_only)
    )


def one_sided_notes(found: Sequence[OneSided], shown: int = 4) -> list[str]:
    """One line per (side, phase, role, name): the modules that only one side passed it to.

    ``only golden passed kwargs.attention_mask to model.layers.0, model.layers.0.self_attn
    (step 0): not compared`` (an eager attention gets the causal mask SDPA builds inside).
    """
    groups: dict[tuple[str, str, str, str], dict[str, set[int]]] = {}
    for o in found:
        mods = groups.setdefault((o.side, o.phase, o.role, o.name), {})
        mods.setdefault(o.module, set()).add(o.step)
    notes = []
    for (side, phase, role, name), mods in groups.items():
        names = list(mods)
        listed = ", ".join(names[:shown]) + (
            f" and {len(names) - shown} more" if len(names) > shown else ""
        )
        steps = sorted(set().union(*mods.values()))
        when = f"step {steps[0]}" if len(steps) == 1 else f"{len(steps)} steps"
        grad = "the gradient of " if phase == "backward" else ""
        if role == "input":
            what = f"only {side} passed {grad}{name} to {listed}"
            example = "an attention mask eager attention takes and SDPA builds inside"
        else:
            what = f"only {side} returned {grad}{name} from {listed}"
            example = "attention weights eager attention returns and SDPA does not"
        notes.append(f"{what} ({when}): not compared (the other side has none; e.g. {example})")
    return notes


def recomputation_notes(g_run: Run, a_run: Run) -> list[str]:
    """A line per side whose run recomputed module calls in backward (checkpointing):
    recognised at capture and not recorded as further calls, which the line says."""
    return [
        f"the {side} recomputed {run.manifest.recomputed_calls} module call(s) during "
        "backward (activation checkpointing): recognised as recomputation, not recorded or "
        "compared as further calls"
        for side, run in (("golden", g_run), ("actual", a_run))
        if run.manifest.recomputed_calls
    ]


def collectives_left_out(count: int, side: str) -> str:
    """The warning that ``count`` collective records of ``side`` had nothing to pair with."""
    return (
        f"{count} collective (dist.*) records only in {side}, whose other side "
        "recorded no collective (e.g. a single-process golden): not compared"
    )


def not_the_same_model(
    g_run: Run,
    a_run: Run,
    matched: int,
    golden_only: list[str],
    actual_only: list[str],
    is_detail: Callable[[str], bool],
) -> str:
    """Why two recordings are taken to be of different models: too few records align.
    The hints that fix it (an msprobe L1 dump, a run that did not finish) come before the
    names, which the CLI's one line may cut."""
    # one side with msprobe API-level records only: an L1 dump
    api_only = any(keys and all(map(is_detail, keys)) for keys in (golden_only, actual_only))
    return (
        f"{a_run.path} does not look like a recording of the same model as {g_run.path}: "
        f"only {matched} records align, {len(golden_only)} are only in golden and "
        f"{len(actual_only)} only in actual"
        + (
            "; one side holds only msprobe API calls (an msprobe L1 dump), which precguard's "
            "module records cannot pair with: dump with msprobe level L0 or mix"
            if api_only
            else ""
        )
        + incomplete_note(g_run, a_run)
        + closest(golden_only, actual_only)
    )


def truncation_note(
    g_run: Run,
    a_run: Run,
    results: list[RecordResult],
    golden_only: list[str],
    actual_only: list[str],
) -> str | None:
    """Say which recording is cut short when its records are a prefix of the other's:
    every unmatched record on one side, none followed by a matched one (a smaller model
    leaves gaps, not a tail)."""
    if golden_only and not actual_only:
        short, other, missing = a_run, g_run, len(golden_only)
    elif actual_only and not golden_only:
        short, other, missing = g_run, a_run, len(actual_only)
    else:
        return None
    gap = False
    for r in results:  # in (rank, step, seq) order
        if r.status == "missing":
            gap = True
        elif gap:
            return None  # a matched record after the unmatched ones: not a cut
    return (
        f"{short.path}: truncated: it lacks {missing} records that {other.path} has and has "
        "none of its own; its records.jsonl was cut short (copy it again)"
    )


def shard_hint(golden: list[int], actual: list[int]) -> str:
    """A pointer to --layout when one shape is the other split along one dimension."""
    if len(golden) != len(actual):
        return ""
    differ = [(g, a) for g, a in zip(golden, actual, strict=True) if g != a]
    if len(differ) == 1 and min(differ[0]) > 0 and max(differ[0]) % min(differ[0]) == 0:
        return (
            "; if one side is a shard of a tensor-parallel run, compare with --layout "
            "(docs/layouts.md)"
        )
    return ""
