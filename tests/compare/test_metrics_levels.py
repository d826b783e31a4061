"""Metrics by level: a compare result's metrics are the model of the level they were measured at.

A user reads ``r.metrics`` off a comparison: full tensors give :class:`FullMetrics`
(cosine, ULPs, ...), statistics :class:`StatsMetrics` (the sample, the positions), integer
tensors :class:`ExactMetrics`. A field its level does not measure is not there to be read
by mistake, and the JSON written is the one every reader knew: every key, in one order,
null where the level lacks it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

import precguard
from precguard.compare import (
    Comparison,
    ExactMetrics,
    FullMetrics,
    MeasuredMetrics,
    RecordResult,
    StatsMetrics,
    UnmeasuredMetrics,
    metrics_of,
    metrics_with,
)

from .conftest import FAULTS, record

#: the keys of a metrics object in compare's JSON, in the order written since schema 1
#: (spelled out: the models may be rearranged, this order may not)
LEGACY_KEYS = [
    "level", "dtype", "error", "max_abs_err", "mean_abs_err", "max_rel_err", "rmse", "rel_l2",
    "cosine", "max_ulp", "rel_err_share", "close_share", "nan_mismatch", "inf_mismatch",
    "stat_rel_diff", "mismatched", "scale", "scale_se", "mean_rel_err", "bias", "peak_error",
    "slice_error", "slice_dim", "slice_index", "sample_size", "sample_rel_l2", "sample_max_abs",
    "sample_rse", "sample_peaks", "pos_dim", "pos_bin", "pos_worst", "pos_worst_err",
    "pos_rel_l2", "note", "rerouted", "reroute_margin", "reroute_tolerance", "routed_rows",
    "error_all_rows", "conc_all_rows",
]  # fmt: skip
#: what a key holds when its level does not set it (the one model's defaults)
LEGACY_DEFAULTS = {"nan_mismatch": 0, "inf_mismatch": 0, "bias": False}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Comparison]:
    """tiny-llama with its MLP output drifted by 0.1%, compared on full tensors and on
    statistics only."""
    root = tmp_path_factory.mktemp("levels")
    fault = next(f for f in FAULTS if f.name == "output-drift-0.1pct")
    golden = record(root / "golden")
    return {
        "full": precguard.compare_runs(golden, record(root / "full", fault=fault)),
        "stats": precguard.compare_runs(golden, record(root / "stats", fault=fault, tensors=False)),
    }


def _levels(result: Comparison) -> dict[str, list[RecordResult]]:
    out: dict[str, list[RecordResult]] = {}
    for r in result.records:
        if r.metrics is not None:
            out.setdefault(r.metrics.level, []).append(r)
    return out


def test_each_record_s_metrics_are_the_model_of_its_level(runs: dict[str, Comparison]) -> None:
    """Full tensors give FullMetrics, statistics StatsMetrics, token ids ExactMetrics."""
    full, stats = _levels(runs["full"]), _levels(runs["stats"])
    assert full["full"] and stats["stats"] and full["exact"]
    assert all(isinstance(r.metrics, FullMetrics) for r in full["full"])
    assert all(isinstance(r.metrics, StatsMetrics) for r in stats["stats"])
    assert all(isinstance(r.metrics, ExactMetrics) for r in full["exact"])
    # both float levels measure a scale; exact metrics have none to read
    assert any(isinstance(r.metrics, MeasuredMetrics) and r.metrics.scale for r in full["full"])
    assert not isinstance(full["exact"][0].metrics, MeasuredMetrics)
    first = runs["stats"].first_divergence
    assert first is not None and isinstance(first.metrics, StatsMetrics)


def test_a_field_its_level_does_not_measure_is_not_there(runs: dict[str, Comparison]) -> None:
    """Reading a full-only field off statistics is an error, not a silent None."""
    stats = next(r.metrics for r in _levels(runs["stats"])["stats"] if r.golden_dtype == "float32")
    full = _levels(runs["full"])["full"][0].metrics
    assert isinstance(stats, StatsMetrics) and isinstance(full, FullMetrics)
    assert stats.sample_size and full.cosine is not None
    with pytest.raises(AttributeError):
        stats.cosine  # type: ignore[attr-defined]  # noqa: B018
    with pytest.raises(AttributeError):
        full.sample_rse  # type: ignore[attr-defined]  # noqa: B018
    # nor can a value be put there: by construction, from JSON, or by model_copy
    with pytest.raises(ValueError, match="cosine"):
        StatsMetrics(level="stats", dtype="float32", error=0.0, cosine=0.99)  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="cosine"):
        metrics_of({"level": "stats", "dtype": "float32", "error": 0.0, "cosine": 0.99})
    with pytest.raises(ValueError, match="stats metrics have no cosine"):
        stats.model_copy(update={"cosine": 0.99})
    with pytest.raises(ValueError, match="metrics_with"):
        stats.model_copy(update={"level": "full"})
    # what every level has can be set on any: the rules after the measurement do
    assert stats.model_copy(update={"bias": True, "rerouted": -1}).bias


def test_every_level_writes_every_key_in_the_order_readers_know(
    runs: dict[str, Comparison],
) -> None:
    """The JSON of each level has the one model's keys, in its order, null where the level
    lacks the key (every level has the keys with a non-null default): old readers see what
    they saw."""
    unmeasured = UnmeasuredMetrics(level="none", dtype="float32", error=math.inf, note="shapes")
    examples = [r.metrics for rs in _levels(runs["full"]).values() for r in rs[:1]]
    examples += [_levels(runs["stats"])["stats"][0].metrics, unmeasured]
    assert {m.level for m in examples if m is not None} == {"full", "stats", "exact", "none"}
    for m in examples:
        assert m is not None
        written = json.loads(m.model_dump_json())
        assert list(written) == LEGACY_KEYS
        for key, value in written.items():
            if key not in type(m).model_fields:  # a key the level lacks
                assert value is None, (m.level, key)
    # and the whole report: each record's metrics in that order
    report = json.loads(runs["stats"].model_dump_json())
    assert all(list(r["metrics"]) == LEGACY_KEYS for r in report["records"] if r["metrics"])


def test_a_report_read_back_is_the_same_bytes_and_the_same_models(
    runs: dict[str, Comparison], tmp_path: Path
) -> None:
    """A JSON round trip: each record's metrics come back as its level's model."""
    for result in runs.values():
        text = result.model_dump_json(indent=2)
        again = Comparison.model_validate_json(text)
        assert again.model_dump_json(indent=2) == text
        assert [type(r.metrics) for r in again.records] == [type(r.metrics) for r in result.records]


def test_metrics_written_with_nulls_for_every_key_read_back_as_their_level() -> None:
    """A report written before the levels were told apart (every key, null where unset)."""
    for level, cls, own in [
        ("full", FullMetrics, {"cosine": 0.999, "rel_l2": 1e-3, "max_ulp": 2.0}),
        ("stats", StatsMetrics, {"sample_size": 128, "stat_rel_diff": {"l2": 1e-3}}),
        ("exact", ExactMetrics, {"mismatched": 0}),
        ("none", UnmeasuredMetrics, {"note": "no statistics recorded"}),
    ]:
        old = dict.fromkeys(LEGACY_KEYS) | LEGACY_DEFAULTS
        old |= {"level": level, "dtype": "float32", "error": 1e-3, **own}
        m = metrics_of(old)
        assert type(m) is cls
        assert json.loads(m.model_dump_json()) == old


def test_metrics_with_builds_the_model_of_the_level_it_ends_at() -> None:
    """A router's verdict copied onto a follower of another level (routing.py) keeps what
    both levels have and leaves the old level's own fields behind."""
    ids = ExactMetrics(level="exact", dtype="int64", error=0.25, mismatched=3, note="re-routed")
    as_stats = metrics_with(
        ids, {"level": "stats", "error": 0.01, "mismatched": None, "stat_rel_diff": {"l2": 0.01}}
    )
    assert isinstance(as_stats, StatsMetrics)
    assert (as_stats.error, as_stats.note, as_stats.stat_rel_diff) == (
        0.01,
        "re-routed",
        {"l2": 0.01},
    )
    with pytest.raises(ValueError, match="cosine"):
        metrics_with(ids, {"level": "stats", "cosine": 0.5})
    # the router's full-tensor verdict on its exact indices: cosine and rel_l2, which exact
    # metrics lack, are left behind without being named; the routing fields stay
    router = FullMetrics(
        level="full", dtype="float32", error=0.02, rel_l2=0.02, cosine=0.9, rerouted=2
    )
    as_ids = metrics_with(
        router, {"level": "exact", "dtype": "int64", "error": 0.25, "mismatched": 3}
    )
    assert isinstance(as_ids, ExactMetrics)
    assert (as_ids.error, as_ids.mismatched, as_ids.rerouted) == (0.25, 3, 2)


# -- the bytes written: a fixed fixture, written by the one model every level replaced ------

_ROUTING = {
    "rerouted": 2,
    "reroute_margin": 1.5e-3,
    "reroute_tolerance": 2e-4,
    "routed_rows": 96,
    "error_all_rows": 0.25,
    "conc_all_rows": math.inf,
}
_EVERY_LEVEL = {"nan_mismatch": 1, "inf_mismatch": 2, "bias": True, "note": 'a "note" é'}
_CONCENTRATED = {
    "scale": 1.01,
    "scale_se": 1e-4,
    "peak_error": 3e-2,
    "slice_error": 0.125,
    "slice_dim": 1,
    "slice_index": 7,
}
#: per level, its fewest fields and every field it has set (NaN and Infinity among them)
EXAMPLES: dict[str, dict[str, Any]] = {
    "full": {"level": "full", "dtype": "float32", "error": 0.0},
    "full, every field": {
        "level": "full",
        "dtype": "bfloat16",
        "error": 3e-3,
        "max_abs_err": 0.02,
        "mean_abs_err": 1e-3,
        "max_rel_err": math.nan,
        "rmse": 1.3e-3,
        "rel_l2": 3e-3,
        "cosine": 0.999999,
        "max_ulp": 4.0,
        "rel_err_share": {"1e-2": 0.0, "1e-3": 0.5},
        "close_share": 0.01,
        "mean_rel_err": -1e-5,
        **_CONCENTRATED,
        **_EVERY_LEVEL,
        **_ROUTING,
    },
    "stats": {"level": "stats", "dtype": "float16", "error": 1e-3},
    "stats, every field": {
        "level": "stats",
        "dtype": "float16",
        "error": 2e-3,
        "stat_rel_diff": {"min": 1e-3, "max": -math.inf},
        "sample_size": 4096,
        "sample_rel_l2": 2e-3,
        "sample_max_abs": 0.01,
        "sample_rse": 0.02,
        "sample_peaks": [0.5, 0.25],
        "pos_dim": 1,
        "pos_bin": 4,
        "pos_worst": 12,
        "pos_worst_err": 4e-3,
        "pos_rel_l2": 1e-3,
        **_CONCENTRATED,
        **_EVERY_LEVEL,
        **_ROUTING,
    },
    "exact": {"level": "exact", "dtype": "int64", "error": 0.0, "mismatched": 0},
    "exact, every field": {
        "level": "exact",
        "dtype": "int64",
        "error": 0.25,
        "mismatched": 3,
        **_EVERY_LEVEL,
        **_ROUTING,
    },
    "none": {"level": "none", "dtype": "float32", "error": math.inf},
    "none, every field": {"level": "none", "dtype": "float32", "error": math.inf, **_EVERY_LEVEL},
}
#: each example's JSON as the one model with every field wrote it (before issue 38's levels
#: without placeholders), compact and indented: the bytes readers of reports have
FIXTURE = Path(__file__).with_name("metrics_levels.json")


def test_each_level_writes_the_bytes_it_always_wrote() -> None:
    """Byte for byte, compact and indented, every key and value kind (NaN, Infinity, nested
    shares, the note's quotes and accents); and the bytes read back are written again."""
    written = json.loads(FIXTURE.read_text(encoding="utf-8"))
    assert set(written) == {f"{name}{form}" for name in EXAMPLES for form in ("", " indented")}
    for name, fields in EXAMPLES.items():
        m = metrics_of(fields)
        assert m.level == fields["level"]
        assert m.model_dump_json() == written[name], name
        assert m.model_dump_json(indent=2) == written[f"{name} indented"], name
        again = metrics_of(json.loads(written[name]))  # NaN != NaN: compare what is written
        assert type(again) is type(m) and again.model_dump_json() == written[name], name


def test_include_and_exclude_take_whole_keys_of_a_metrics_object() -> None:
    """What pydantic's include/exclude do on any model, they do here (a plain serializer gets
    them, not the dict it returns); a filter inside one key is refused, never ignored."""
    m = metrics_of(EXAMPLES["full, every field"])
    assert list(m.model_dump(include={"cosine", "note"})) == ["cosine", "note"]
    assert list(m.model_dump(exclude={"note"})) == [k for k in LEGACY_KEYS if k != "note"]
    # a key the level lacks is a key of the JSON like any other
    assert m.model_dump(include={"sample_rse"}) == {"sample_rse": None}
    with pytest.raises(ValueError, match="included or excluded whole"):
        m.model_dump(exclude={"rel_err_share": {"1e-2"}})


def test_the_json_schema_of_what_is_written_has_every_key_described() -> None:
    """The schema of the written JSON (what a reader validates against) is the bytes'."""
    for cls in (FullMetrics, StatsMetrics, ExactMetrics, UnmeasuredMetrics):
        written = cls.model_json_schema(mode="serialization")["properties"]
        assert list(written) == LEGACY_KEYS, cls
        assert all(p.get("description") for p in written.values()), cls
        # what it reads is what it has
        assert list(cls.model_json_schema()["properties"]) == list(cls.model_fields), cls
