"""Checklists: load them, run their checks, and build one :class:`Diagnosis`.

A checklist is a YAML file (shipped ones live in ``precguard/checklists/``)::

    name: quick
    description: seconds, for CI
    checks:
      - env.fingerprint                  # a check id ...
      - id: norm.extreme_inputs          # ... or an id with parameters
        params: {tolerance: 0.05}
      - env.*                            # a glob: every registered env check

Checks come from the ``precguard_register_checks`` plugin hook (the built-in
ones through :mod:`precguard.checks.builtin`). A check that raises becomes an
``error`` finding and the run goes on; one that cannot apply is ``skip`` with
the reason.
"""

from __future__ import annotations

import fnmatch
import inspect
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from torch import nn

from precguard._logging import get_logger
from precguard.checks.base import (
    Check,
    CheckContext,
    Finding,
    NotApplicable,
    family_of,
    family_rank,
)
from precguard.devices import parse_dtype
from precguard.errors import PrecguardError, UsageError
from precguard.report.models import Diagnosis
from precguard.target_run import Side, one_side

logger = get_logger(__name__)

SCHEMA_VERSION = 1

_STATUS_RANK = {"fail": 0, "error": 1, "warn": 2}


class ChecklistError(UsageError):
    """A checklist file is missing, malformed, or names checks nobody registered."""


class ChecklistEntry(BaseModel):
    """One line of a checklist: a check id (or glob) and its parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(description="Check id 'family.name', or a glob such as 'env.*'.")
    params: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to the check."
    )

    @field_validator("id")
    @classmethod
    def _family_known(cls, value: str) -> str:
        family_of(value)
        return value


class Checklist(BaseModel):
    """A named list of checks, as written in a checklist YAML file."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    schema_version: int = Field(default=SCHEMA_VERSION, description="Checklist format version.")
    name: str = Field(description="Checklist name, e.g. 'llama-finetune'.")
    description: str = Field(description="What the checklist is for.")
    checks: list[ChecklistEntry] = Field(description="Checks to run, in order.")

    @field_validator("checks", mode="before")
    @classmethod
    def _strings_are_ids(cls, value: Any) -> Any:
        if isinstance(value, list):
            return [{"id": v} if isinstance(v, str) else v for v in value]
        return value


# -- loading ----------------------------------------------------------------


def builtin_checklists() -> list[str]:
    """Names of the checklists shipped with precguard."""
    folder = resources.files("precguard") / "checklists"
    return sorted(p.name[: -len(".yaml")] for p in folder.iterdir() if p.name.endswith(".yaml"))


def load_checklist(spec: str | Path) -> Checklist:
    """Load a checklist by shipped name (``llama-finetune``) or path to a YAML file.

    Raises :class:`ChecklistError` naming the file and the offending field.
    """
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ChecklistError(f"checklist {spec}: no such file")
        text, where = path.read_text(encoding="utf-8"), str(path)
    else:
        shipped = resources.files("precguard") / "checklists" / f"{spec}.yaml"
        if not shipped.is_file():
            from precguard.suggest import did_you_mean

            raise ChecklistError(
                f"unknown checklist {str(spec)!r}{did_you_mean(str(spec), builtin_checklists())}: "
                f"not a file and not one of {', '.join(builtin_checklists())}"
            )
        text, where = shipped.read_text(encoding="utf-8"), f"checklist {spec}"
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ChecklistError(f"{where}: not valid YAML ({exc})") from exc
    if not isinstance(raw, dict):
        raise ChecklistError(f"{where}: expected a mapping with name, description, checks")
    try:
        return Checklist.model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ChecklistError(f"{where}: field '{loc}': {err['msg']}") from exc


def registered_checks() -> dict[str, Check]:
    """Every check registered through the plugin hook, by id.

    A plugin installed later can replace a check by registering the same id
    (see :func:`precguard.plugins.collect_checks`).
    """
    from precguard import plugins

    return plugins.collect_checks()


def _matches(check_id: str, patterns: Sequence[str]) -> bool:
    for pattern in patterns:
        full = pattern if "." in pattern else f"{pattern}.*"  # a bare family name
        if fnmatch.fnmatchcase(check_id, full):
            return True
    return False


def plan(
    checklist: Checklist,
    available: dict[str, Check],
    only: Sequence[str] = (),
    skip: Sequence[str] = (),
) -> list[tuple[Check, dict[str, Any]]]:
    """Resolve a checklist's entries to registered checks, honouring ``only`` and ``skip``."""
    steps: list[tuple[Check, dict[str, Any]]] = []
    seen: set[str] = set()
    families = sorted({check_id.split(".", 1)[0] for check_id in available})
    for entry in checklist.checks:
        if entry.id.split(".", 1)[0] not in families:  # families are open: a typo shows here
            raise ChecklistError(
                f"checklist {checklist.name}: no check {entry.id!r} is registered: no plugin "
                f"registers its family (families: {', '.join(families)})"
            )
        if any(c in entry.id for c in "*?["):
            ids = sorted(i for i in available if fnmatch.fnmatchcase(i, entry.id))
        elif entry.id in available:
            ids = [entry.id]
        else:
            raise ChecklistError(
                f"checklist {checklist.name}: no check {entry.id!r} is registered"
                + (
                    _did_you_mean_check(entry.id, available)
                    or f" (known: {', '.join(sorted(available))})"
                )
            )
        for check_id in ids:
            if check_id in seen:
                continue
            if only and not _matches(check_id, only):
                continue
            if skip and _matches(check_id, skip):
                continue
            seen.add(check_id)
            _check_params(available[check_id], entry.params, checklist.name)
            steps.append((available[check_id], dict(entry.params)))
    for pattern in only:
        if not any(_matches(c.id, [pattern]) for c, _ in steps):
            raise ChecklistError(
                f"--only {pattern}: matches no check of {checklist.name}"
                + _did_you_mean_check(pattern, available)
            )
    for pattern in skip:
        if not any(_matches(check_id, [pattern]) for check_id in available):
            raise ChecklistError(
                f"--skip {pattern}: matches no registered check"
                + _did_you_mean_check(pattern, available)
            )
    return steps


def _did_you_mean_check(pattern: str, available: dict[str, Check]) -> str:
    """Suggest check ids and families close to a mistyped ``--only``/``--skip`` pattern."""
    from precguard.suggest import did_you_mean

    families = {check_id.split(".", 1)[0] for check_id in available}
    return did_you_mean(pattern, [*available, *families])


def _check_params(chk: Check, params: dict[str, Any], where: str) -> None:
    """Reject parameters the check's function does not take (a typo is an error)."""
    if not params:
        return
    try:
        sig = inspect.signature(chk.func)
    except (TypeError, ValueError):
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return
    accepted = list(sig.parameters)[1:]
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ChecklistError(
            f"checklist {where}: check {chk.id} has no parameter {', '.join(unknown)} "
            f"(it takes: {', '.join(accepted) or 'none'})"
        )


# -- running ----------------------------------------------------------------


def run_check(check: Check, ctx: CheckContext, params: dict[str, Any]) -> list[Finding]:
    """Run one check; turn "not applicable" into ``skip`` and any exception into ``error``.

    A :class:`~precguard.errors.PrecguardError` (the target cannot be built, the
    golden is corrupt) is not the check's result but unusable input: it propagates.
    """
    from precguard.checks.base import finding

    if check.needs_target and ctx.target is None:
        return [finding(check.id, "skip", "needs a target (--target)")]
    try:
        result = check.func(ctx, **params)
    except NotApplicable as exc:
        return [finding(check.id, "skip", f"not applicable: {exc}")]
    except PrecguardError:
        raise  # unusable input (a target that cannot be built, a corrupt golden): exit 2
    except TypeError as exc:
        if "unexpected keyword argument" in str(exc) and params:
            return [_error(check, exc, hint=f"parameters given: {sorted(params)}")]
        return [_error(check, exc)]
    except Exception as exc:
        return [_error(check, exc)]
    items = [result] if isinstance(result, Finding) else list(result or [])
    if not items:
        return [finding(check.id, "error", "the check returned no finding")]
    return items


def _error(check: Check, exc: BaseException, hint: str = "") -> Finding:
    from precguard.checks.base import finding

    logger.warning("check_raised", check=check.id, error=f"{type(exc).__name__}: {exc}")
    tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
    evidence: dict[str, Any] = {"exception": f"{type(exc).__name__}: {exc}", "traceback": tb[-3:]}
    if hint:
        evidence["hint"] = hint
    return finding(
        check.id,
        "error",
        f"the check could not run: {type(exc).__name__}: {exc}",
        evidence,
        "This is a problem running the check, not a verdict on the model; rerun with "
        "--debug --log-level debug and report it if the target is fine.",
    )


def rank_root_causes(findings: Sequence[Finding]) -> list[Finding]:
    """Failures first, then errors, then warnings; within each, in the order of ``FAMILIES``
    (a family a plugin brings ranks after the built-in ones), then in the order they ran."""
    flagged = [(i, f) for i, f in enumerate(findings) if f.status in _STATUS_RANK]
    flagged.sort(key=lambda p: (_STATUS_RANK[p[1].status], family_rank(p[1].family), p[0]))
    return [f for _, f in flagged]


def _reference_side(reference: str | Side, side: Side | None) -> Side | None:
    """The reference Side of a check run: ``reference`` as given, or the device side's
    target on the ``reference`` device; a usage error when it cannot be the checks'.

    The checks build one model and copy it to both devices, in float32 on the
    reference, so a reference Side must name the same target, leave the dtype unset
    (or float32) and carry no ``prepare`` of its own.
    """
    if not isinstance(reference, Side):
        return None if side is None else Side(side.target, reference, torch.float32, side.prepare)
    if side is None:
        raise UsageError("check: a reference Side given without a target")
    if reference.target != side.target:
        raise UsageError(
            f"check: the reference Side runs {reference.target!r}, the device's "
            f"{side.target!r}; the checks compare one target on two devices"
        )
    if reference.dtype is not None and parse_dtype(reference.dtype) != torch.float32:
        raise UsageError(
            f"check: the reference Side's dtype is {reference.dtype}; the checks run the "
            "reference in float32 (leave it unset)"
        )
    if reference.prepare is not None and reference.prepare is not side.prepare:
        raise UsageError(
            "check: the reference Side has a prepare of its own; the checks copy one "
            "built model to both devices, so set prepare on the device's Side"
        )
    return reference.replace(dtype=torch.float32, prepare=side.prepare)


def verdict_of(counts: dict[str, int]) -> Literal["pass", "fail", "inconclusive"]:
    """'fail' on any fail or error; 'inconclusive' unless some check passed or warned."""
    if counts.get("fail") or counts.get("error"):
        return "fail"
    if not counts.get("pass") and not counts.get("warn"):
        return "inconclusive"
    return "pass"


def check(
    checklist: str | Path | Checklist = "llama-finetune",
    target: Any = "tiny-llama",
    *,
    device: str | None = None,
    reference: str | Side = "cpu",
    golden: str | Path | None = None,
    dtype: str | None = None,
    prepare: Callable[[nn.Module], Any] | None = None,
    only: Sequence[str] = (),
    skip: Sequence[str] = (),
    on_progress: Callable[[str, int, int], None] | None = None,
) -> Diagnosis:
    """Run a checklist on a target, device under test against reference; return the Diagnosis.

    :param checklist: shipped name, YAML path, or a :class:`Checklist`.
    :param target: the device under test as a :class:`~precguard.Side` (the one way:
        ``check("quick", Side("tiny-llama", "emu:fp16"))``), or a target spec
        (``tiny-llama``, ``file.py:fn``) or ``Target`` with the side's ``device``
        (default ``"cpu"``), ``dtype`` and ``prepare`` as keywords (a keyword beside a
        Side is a usage error); None runs only the checks that need none.
    :param reference: the trusted reference device, or a Side of the same target on it
        (the checks run the reference in float32, and build one model that both sides
        copy, so the device Side's ``prepare`` reaches both).
    :param golden: a golden recording for the ``layerwise``, ``data`` and ``env`` checks.
    :param dtype: model dtype on the device; None means float32, or the storage dtype
        of a mixed-precision device (``emu:fp16-mixed``).
    :param only: run only these check ids, globs or family names; ``skip``: leave these out.
    :param on_progress: called as ``(check_id, index, total)`` before each check.

    >>> d = precguard.check("quick", Side("tiny-llama", "emu:fp16"))   # doctest: +SKIP
    >>> d.verdict, d.root_cause
    """
    from precguard.devices import dtype_name, resolve_backend
    from precguard.target import load_target
    from precguard.target_run import model_dtype as target_model_dtype

    started = time.perf_counter()
    created = datetime.now(timezone.utc).isoformat(timespec="seconds")
    side = (
        one_side(target, "check", device=device, dtype=dtype, prepare=prepare)
        if target is not None
        else None
    )
    reference_side = _reference_side(reference, side)
    device = side.device if side is not None else device or "cpu"
    reference = reference_side.device if isinstance(reference, Side) else reference
    spec = checklist if isinstance(checklist, Checklist) else load_checklist(checklist)
    device_backend = resolve_backend(device)
    model_dtype = target_model_dtype(device_backend, side.dtype if side is not None else dtype)
    dtype = dtype_name(model_dtype)
    reference_backend = resolve_backend(reference)
    golden_path = Path(golden) if golden is not None else None
    if golden_path is not None and not (golden_path / "manifest.json").is_file():
        raise UsageError(f"--golden {golden_path}: not a precguard recording (no manifest.json)")
    target_obj = load_target(side.target) if side is not None else None
    steps = plan(spec, registered_checks(), only, skip)
    ctx = CheckContext(
        device=device,
        reference=reference,
        target=target_obj,
        golden=golden_path,
        dtype=dtype,
        backends={reference: reference_backend, device: device_backend},
        # the target loaded once: the checks' Lab opens both sides without importing it again
        side=side.replace(target=target_obj, dtype=model_dtype) if side is not None else None,
        reference_side=(
            reference_side.replace(target=target_obj, dtype=torch.float32)
            if reference_side is not None
            else None
        ),
    )
    findings: list[Finding] = []
    durations: dict[str, float] = {}
    for index, (chk, params) in enumerate(steps):
        if on_progress is not None:
            on_progress(chk.id, index, len(steps))
        t0 = time.perf_counter()
        results = run_check(chk, ctx, params)
        durations[chk.id] = round(time.perf_counter() - t0, 3)
        logger.info("check_done", check=chk.id, statuses=[f.status for f in results])
        findings.extend(results)
    counts = {
        s: sum(f.status == s for f in findings) for s in ("pass", "warn", "fail", "skip", "error")
    }
    bench = ctx.cache.get("lab")  # absent when no check needed the target
    measured = bench.measured_compute_dtype if bench is not None else None
    return Diagnosis(
        checklist=spec.name,
        target=target_obj.name if target_obj is not None else None,
        device=device,
        reference=reference,
        dtype=dtype_name(model_dtype),
        compute_dtype=dtype_name(measured) if measured is not None else None,
        golden=str(golden_path) if golden_path is not None else None,
        verdict=verdict_of(counts),
        counts=counts,
        root_causes=rank_root_causes(findings),
        findings=findings,
        durations=durations,
        duration_s=round(time.perf_counter() - started, 3),
        created=created,
    )
