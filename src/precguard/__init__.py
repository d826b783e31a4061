"""precguard: find where and why a model computes different numbers on another backend.

The public API, nothing else; everything heavy is imported on first use.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS: dict[str, str] = {
    "monitor": "precguard.capture.api",
    "record": "precguard.capture.api",
    "precision_monitor": "precguard.capture.api",
    "unmonitor": "precguard.capture.api",
    "MonitorHandle": "precguard.capture.api",
    "Handle": "precguard.capture.handle",
    "CaptureOptions": "precguard.capture.options",
    "load_run": "precguard.dump.reader",
    "Run": "precguard.dump.reader",
    "Record": "precguard.dump.schema",
    "Manifest": "precguard.dump.schema",
    # a Record's fields (docs/recording.md): stats, tensor, sample, positions
    "Stats": "precguard.dump.schema",
    "TensorRef": "precguard.dump.schema",
    "Sample": "precguard.dump.schema",
    "PositionNorms": "precguard.dump.schema",
    "Target": "precguard.target",
    "load_target": "precguard.target",
    # one side of a comparison (target, device, dtype, set-up): what every entry point takes
    "Side": "precguard.target_run",
    "record_target": "precguard.runner",
    "Backend": "precguard.backend",
    "Switch": "precguard.backend",
    "hookimpl": "precguard.hookspecs",
    "PrecguardError": "precguard.errors",
    "NonFiniteError": "precguard.errors",
    "ExitCode": "precguard.errors",
    # the errors a caller catches, each with its exit code (docs/moved.md)
    "UsageError": "precguard.errors",
    "TargetError": "precguard.errors",
    "DeviceUnavailableError": "precguard.errors",
    "DumpFormatError": "precguard.errors",
    "OutputExistsError": "precguard.errors",
    # a device string ("cpu", "emu:bf16", "npu:0") -> its usable Backend, what --device does
    "resolve_backend": "precguard.devices",
    # the seeding every `precguard record` starts from (torch, the device, random, NumPy)
    "seed_everything": "precguard.devices",
    "compare_runs": "precguard.layout.compare",  # defined in compare.runs; layout adds layout=
    "CompareOptions": "precguard.compare.options",
    "Comparison": "precguard.compare",
    "check": "precguard.checklist",
    "Diagnosis": "precguard.checklist",
    "generate_diff": "precguard.generation",
    "GenerationDiff": "precguard.generation",
    "watch": "precguard.training.handle",
    "WatchHandle": "precguard.training.handle",
    # a watch directory read back (what `precguard watch-report` reads)
    "load_watch": "precguard.training.report",
    "WatchRun": "precguard.training.report",
    # one function per command (precguard replay / bisect / op-check / ranks / import-msprobe)
    "replay_module": "precguard.localize.replay",
    "bisect": "precguard.localize.bisect",
    "op_check": "precguard.opcheck.sweep",
    "check_replicas": "precguard.ranks",
    "compare_bitwise": "precguard.compare.bitwise",
    "import_msprobe": "precguard.interop.msprobe",
    # `recording` is the context manager (`record`, its old name, is deprecated);
    # `record_target` is what `precguard record --target` runs
    "recording": "precguard.capture.api",
    # what the entry points return or hand over, for a caller to annotate and read
    "BisectResult": "precguard.localize.bisect",
    "BitwiseComparison": "precguard.compare.bitwise",
    "BitwiseDifference": "precguard.compare.bitwise",
    "TargetRun": "precguard.target_run",  # Side.open()
    # replay a comparison's first divergence and suspects alone (docs/compare.md)
    "replay_suspects": "precguard.localize.confirm",
    # the error budget and its verified remedies (docs/impact.md): check/op-check/compare --verify
    "verify": "precguard.localize.verify",
    "comparison_sides": "precguard.localize.impact",
    "ErrorBudget": "precguard.compare.impact_report",
}

__all__ = ["__version__", *_EXPORTS]

if TYPE_CHECKING:
    from precguard.backend import Backend, Switch
    from precguard.capture.api import (
        MonitorHandle,
        monitor,
        precision_monitor,
        record,
        recording,
        unmonitor,
    )
    from precguard.capture.handle import Handle
    from precguard.capture.options import CaptureOptions
    from precguard.checklist import Diagnosis, check
    from precguard.compare import Comparison
    from precguard.compare.bitwise import BitwiseComparison, BitwiseDifference, compare_bitwise
    from precguard.compare.impact_report import ErrorBudget
    from precguard.compare.options import CompareOptions
    from precguard.devices import resolve_backend, seed_everything
    from precguard.dump.reader import Run, load_run
    from precguard.dump.schema import Manifest, PositionNorms, Record, Sample, Stats, TensorRef
    from precguard.errors import (
        DeviceUnavailableError,
        DumpFormatError,
        ExitCode,
        NonFiniteError,
        OutputExistsError,
        PrecguardError,
        TargetError,
        UsageError,
    )
    from precguard.generation import GenerationDiff, generate_diff
    from precguard.hookspecs import hookimpl
    from precguard.interop.msprobe import import_msprobe
    from precguard.layout.compare import compare_runs
    from precguard.localize.bisect import BisectResult, bisect
    from precguard.localize.confirm import replay_suspects
    from precguard.localize.impact import comparison_sides
    from precguard.localize.replay import replay_module
    from precguard.localize.verify import verify
    from precguard.opcheck.sweep import op_check
    from precguard.ranks import check_replicas
    from precguard.runner import record_target
    from precguard.target import Target, load_target
    from precguard.target_run import Side, TargetRun
    from precguard.training.handle import WatchHandle, watch
    from precguard.training.report import WatchRun, load_watch


#: subpackages reachable as attributes whatever was imported first
_SUBPACKAGES = frozenset({"compare"})


def __getattr__(name: str) -> Any:
    import importlib

    if name in _SUBPACKAGES:
        return importlib.import_module(f"precguard.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'precguard' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    # the lazy exports are attributes too: dir(precguard) and tab completion list them
    return sorted({*globals(), *_EXPORTS, *_SUBPACKAGES})
