"""``precguard compare``'s options checked and turned into the compare job's steps.

The job (:func:`precguard.compare.job`) compares; what ``--replay`` and
``--target``/``--verify`` add runs after it, in ``localize/``, as the job's
``then`` steps built here.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from precguard.cli._out import wrote
from precguard.errors import UsageError

Step = Callable[[Any], Any]


def check_usage(*, top: int, replay_top: int, actual: Path, **given: Any) -> None:
    """Raise a one-line UsageError for an option combination compare cannot run."""
    if top < 0:
        raise UsageError(f"--top must be >= 0, got {top}")
    if replay_top < 1:
        raise UsageError(f"--replay-top must be >= 1, got {replay_top}")
    target, layout = given["--target"], given["--layout"]
    if given["--replay"] and target is None:
        from precguard.compare.hints import replay_suggestion
        from precguard.compare.runs import open_side

        raise UsageError(replay_suggestion(open_side(actual).run.manifest.target))
    if given["--replay"] and layout is not None:
        raise UsageError(
            "--replay cannot be used with --layout: a sharded module runs only inside its "
            "process group (see docs/layouts.md)"
        )
    if (given["--verify"] or given["--device"] is not None) and target is None:
        raise UsageError(
            f"{'--verify' if given['--verify'] else '--device'} re-runs the actual side: it "
            "needs --target (the code the actual side ran)"
        )
    if target is not None and layout is not None:
        raise UsageError(
            "--target cannot be used with --layout: a sharded model runs only inside its "
            "process group (see docs/layouts.md)"
        )
    if target is not None:  # a target that cannot load (a SyntaxError): one line, exit 2,
        from precguard.target import load_target  # before anything is compared

        load_target(target)


def then_steps(
    *, target: str | None, device: str | None, verify: bool, replay: bool, top: int
) -> list[Step]:
    """The steps after the comparison: the replays, then the impact (and remedies)."""
    steps: list[Step] = []
    if target is None:
        return steps
    if replay:
        from precguard.localize.confirm import replay_suspects

        steps.append(lambda result: replay_suspects(result, target=target, top=top))

    def impact(result: Any) -> Any:
        if result.verdict == "match":
            return result
        from precguard.localize.impact import comparison_sides
        from precguard.localize.verify import verify as verify_comparison

        golden, actual = comparison_sides(result, target, device=device)
        return verify_comparison(result, actual, golden=golden, remedies=verify)

    steps.append(impact)
    return steps


def run_bitwise_spelling(
    golden: Path,
    actual: Path,
    given: dict[str, Any],
    *,
    rank: int | None,
    step: int | None,
    json_out: Path | None,
) -> None:
    """``compare --bitwise``, the old spelling of ``precguard bitwise``."""
    ignored = [name for name, value in given.items() if value]
    if ignored:
        raise UsageError(
            "--bitwise (now `precguard bitwise`) compares hashes only; it takes --json, "
            f"--rank and --step, not {', '.join(ignored)}"
        )
    from precguard.cli.bitwise import run_bitwise

    moved = "note: compare --bitwise is now `precguard bitwise`"
    run_bitwise(golden, actual, rank=rank, step=step, json_out=json_out, note=moved)


def write_files(
    result: Any, golden: Path, actual: Path, html: Path | None, csv: Path | None,
    junit: Path | None, json_out: Path | None, allow_partial: bool,
) -> None:  # fmt: skip
    """What compare writes: --html, --csv, --junit-xml, --json, each announced."""
    from precguard.compare.report import write_comparison_json

    if html is not None or csv is not None:
        from precguard.report.comparison import write_comparison_reports

        write_comparison_reports(result, html=html, csv=csv, golden=golden, actual=actual)
        for path in (csv, html):
            if path is not None:
                wrote(path)
    if junit is not None:
        from precguard.report.junit import comparison_junit, write_junit

        write_junit(junit, comparison_junit(result, allow_partial=allow_partial))
        wrote(junit)
    if json_out is not None and str(json_out) == "-":
        import io

        from precguard.cli._out import print_json

        buffer = io.StringIO()
        write_comparison_json(result, buffer)
        print_json(buffer.getvalue())
    elif json_out is not None:
        from precguard.dump.atomic import atomic_output

        with atomic_output(json_out, what="--json") as fh:  # whole or not at all
            write_comparison_json(result, fh)
            fh.write("\n")
        wrote(json_out)
