"""One CompareOptions: keyword arguments build it, workers rebuild it from its JSON."""

from __future__ import annotations

import pydantic
import pytest

import precguard
from precguard import UsageError
from precguard.compare.engine import plan_comparison, plan_from_arguments
from precguard.compare.options import CompareOptions, compare_options
from tests.compare.test_compare_workers import write_pair


def test_keyword_arguments_and_an_options_object_compare_alike(tmp_path):
    golden, actual = write_pair(tmp_path)
    by_keywords = precguard.compare_runs(golden, actual, profile="strict", step=1, suspects=0)
    options = CompareOptions(profile="strict", step=1, suspects=0)
    by_object = precguard.compare_runs(golden, actual, options)
    assert by_object.model_dump_json() == by_keywords.model_dump_json()
    assert by_object.profile == "strict" and {r.step for r in by_object.records} == {1}
    assert by_object.suspects == []


def test_keywords_win_over_the_options_they_are_given_with():
    merged = compare_options(CompareOptions(profile="strict", step=2), step=0)
    assert (merged.profile, merged.step) == ("strict", 0)
    assert compare_options(None) == CompareOptions()


def test_a_misspelled_option_is_an_error_not_a_silent_default(tmp_path):
    golden, actual = write_pair(tmp_path)
    with pytest.raises(pydantic.ValidationError, match="tolerance_dypte"):
        precguard.compare_runs(golden, actual, tolerance_dypte="golden")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [("tolerance_dtype", "int8", "--tolerance-dtype must be"), ("workers", 0, "--workers")],
)
def test_a_bad_value_is_a_usage_error_before_anything_is_read(field, value, message):
    with pytest.raises(UsageError, match=message):
        CompareOptions(**{field: value})


def test_a_worker_rebuilds_the_same_options_from_their_json(tmp_path):
    golden, actual = write_pair(tmp_path)
    options = CompareOptions(
        profile=precguard.compare.get_profile("fixed"),
        rtol=1e-3,
        tolerance_dtype="bf16",
        rename=("model.*=model.*",),
        workers=2,
    )
    plan = plan_comparison(golden, actual, options)
    again = plan_from_arguments(plan.arguments)
    assert again.options == options and again.options.tolerance_dtype == "bfloat16"
    assert again.prof == plan.prof and plan.prof.dtypes["float32"].rtol == 1e-3


def test_the_layout_is_a_strategy_passed_to_the_compare_job_not_a_global(tmp_path):
    # precguard.compare_runs is the compare job (precguard.compare.job) with the layout's
    # gathering passed in as a strategy (issue 38): compare, below the layout package,
    # holds no installed branch, and says where layout= goes rather than ignoring it
    from precguard.compare import compare_recordings, compare_runs, job
    from precguard.layout import gathered

    golden, actual = write_pair(tmp_path)
    assert precguard.compare_runs.__module__ == "precguard.layout.compare"
    with pytest.raises(UsageError, match=r"layout= is taken by precguard\.compare_runs"):
        compare_recordings(golden, actual, layout="megatron")
    with pytest.raises(UsageError, match=r"layout= gathers through precguard\.layout"):
        compare_runs(golden, actual, layout="megatron")
    with pytest.raises(UsageError, match=r"unknown layout|megatron-nope|no such"):
        precguard.compare_runs(golden, actual, layout="megatron-nope")  # the strategy's error
    with pytest.raises(UsageError, match=r"unknown layout|megatron-nope|no such"):
        job(CompareOptions(), golden, actual, gather=gathered("megatron-nope"))
    # the job reads the golden once and says how many units it holds before comparing
    totals: list[int | None] = []
    result = job(CompareOptions(), golden, actual, on_total=totals.append)
    assert totals == [3 * 4] and result.verdict == "diverged"  # 3 ranks x the golden's 4 steps
