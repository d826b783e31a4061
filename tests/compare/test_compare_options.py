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


def test_compare_runs_is_defined_in_compare_and_takes_layout_there(tmp_path):
    # compare_runs lives in the compare package; its layout branch lives above
    # (precguard.layout.compare, which installs itself): the old import paths still work,
    # and compare_recordings says where layout= goes rather than ignoring it
    from precguard.compare import compare_recordings, compare_runs

    golden, actual = write_pair(tmp_path)
    # precguard.compare_runs is looked up in precguard.layout.compare (the old path): the
    # same object as compare's, so both paths reach one function
    assert precguard.compare_runs is compare_runs
    assert compare_runs.__module__ == "precguard.compare.runs"
    with pytest.raises(UsageError, match=r"layout= is taken by precguard\.compare_runs"):
        compare_recordings(golden, actual, layout="megatron")
    with pytest.raises(UsageError, match=r"unknown layout|megatron-nope|no such"):
        compare_runs(golden, actual, layout="megatron-nope")  # reaches the layout branch
