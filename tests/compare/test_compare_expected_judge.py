"""The expected-error judge on hand-made records: what each record consumed explains it.

Each test is a small step of records as compare pairs them (inputs, parameters,
outputs in capture order) with the errors a real run measured, judged by
:func:`precguard.compare.verdict.judge_unit`, the one pass whose first phase is the judge.
"""

from __future__ import annotations

import pytest

from precguard.compare import RecordResult, calls, get_profile, judge
from precguard.compare.verdict import JudgeInputs, judge_unit
from tests.compare.synthetic import full_record as _rec

DEFAULT = get_profile("default")


def _statuses(records: list[RecordResult]) -> dict[str, str]:
    judged = judge_unit(records, DEFAULT).results
    return {r.key: r.status for r in judged}


def test_another_reduction_order_in_fp32_passes_by_construction() -> None:
    # a tensor-parallel run's weight gradient: rel_l2 2.3e-7 (it failed fp32's fixed 2.6e-6
    # tolerance on another machine only when larger); sqrt(K) u for K = 256 rows is 1e-6
    records = [
        _rec("fc.0.forward.input.0", 0, 0.0, shape=(2, 128, 64)),
        _rec("fc.0.forward.param.0", 1, 0.0, shape=(64, 64)),
        _rec("fc.0.forward.output.0", 2, 3e-7, shape=(2, 128, 64)),
        _rec("fc.0.backward.output.0", 3, 2e-7, shape=(2, 128, 64)),
        _rec("fc.0.backward.input.0", 4, 2.3e-7, shape=(2, 128, 64)),
        _rec("fc.0.backward.grad.0", 5, 2.3e-6, shape=(64, 64)),
    ]
    assert set(_statuses(records).values()) == {"pass"}


def test_an_output_beyond_ten_times_its_expected_error_fails() -> None:
    records = [
        _rec("fc.0.forward.input.0", 0, 0.0),
        _rec("fc.0.forward.output.0", 1, 1e-4),  # 0.01 % from exact fp32 inputs
    ]
    assert _statuses(records)["fc.0.forward.output.0"] == "fail"


def test_error_confined_to_a_few_positions_fails_although_its_global_error_is_small() -> None:
    # rotary cos/sin from exact positions: global rel_l2 7.7x one bf16 rounding, but the
    # late positions are wrong by 0.09 (the classic rope bug)
    records = [
        _rec("rot.0.forward.input.0", 0, 0.0017, dtype="bfloat16", slice_error=0.002),
        _rec("rot.0.forward.output.0", 1, 0.03, dtype="bfloat16", slice_error=0.094, peak=0.2),
    ]
    assert _statuses(records)["rot.0.forward.output.0"] == "fail"
    uniform = [records[0], _rec("rot.0.forward.output.0", 1, 0.0039, dtype="bfloat16")]
    assert _statuses(uniform)["rot.0.forward.output.0"] == "pass"


def test_a_loss_is_judged_against_the_error_of_the_logits_it_was_computed_from() -> None:
    # root = LlamaForCausalLM with labels: fp32 loss of bf16 logits (amplification 1.1e4
    # when judged at fp32 as if token ids were all it consumed)
    records = [
        _rec("root.0.forward.input.0", 0, 0.0, shape=(2, 32)),
        _rec("lm_head.0.forward.input.0", 1, 0.01, dtype="bfloat16"),
        _rec("lm_head.0.forward.output.0", 2, 0.012, dtype="bfloat16", shape=(2, 32, 256)),
        _rec("root.0.forward.output.0", 3, 0.004, shape=()),
    ]
    statuses = _statuses(records)
    assert statuses["root.0.forward.output.0"] == "pass"


def test_a_parameter_after_an_optimizer_step_is_judged_with_that_step() -> None:
    records = [_rec("fc.0.forward.param.0", 0, 2e-5, shape=(64, 64))]
    # without the golden's step: 2e-5 is far beyond one fp32 rounding
    judged = judge_unit(records, DEFAULT, JudgeInputs(previous={"fc.0": 1e-7})).results
    assert judged[0].status == "fail"
    # AdamW moved the weight by 1e-3 of its norm: a different step explains 2e-5
    step = JudgeInputs(previous={"fc.0": 1e-7}, updates={"fc.0": 1e-3})
    judged = judge_unit(records, DEFAULT, step).results
    assert judged[0].status == "pass"


def test_a_calibration_run_raises_the_expected_error_where_the_model_is_too_low() -> None:
    # an ill-conditioned op: 5e-3 from an exact fp32 input is 1e4 times one rounding ...
    records = [
        _rec("cos.0.forward.input.0", 0, 0.0),
        _rec("cos.0.forward.output.0", 1, 5e-3),
    ]
    assert _statuses(records)["cos.0.forward.output.0"] == "fail"
    # ... but the golden's own code at the actual's precision shows 2e-3 there
    cal = JudgeInputs(calibrated={"cos.0.forward.output.0": (2e-3, 2e-3)})
    judged = judge_unit(records, DEFAULT, cal).results
    assert judged[1].status == "pass" and judged[1].expected_error == 2e-3


def test_the_calibration_pass_perturbs_each_modules_inputs_by_one_unit_roundoff() -> None:
    import torch

    from precguard.compare.calibrate import perturb_inputs

    lin = torch.nn.Linear(8, 8, bias=False)
    torch.nn.init.eye_(lin.weight)
    x = torch.ones(4, 8)
    plain = lin(x)
    with perturb_inputs(lin, "bfloat16"):
        perturbed = lin(x)
    rel = ((perturbed - plain).abs() / plain.abs()).unique()
    assert torch.allclose(rel, torch.tensor([2.0**-8]))
    assert torch.equal(lin(x), plain)  # hooks removed: the model computes as before


def test_a_causal_mask_built_with_each_precisions_finfo_min_is_no_error() -> None:
    import torch

    from precguard.compare.metrics import full_metrics

    causal = torch.ones(8, 8, dtype=torch.bool).tril()
    golden = torch.zeros(8, 8).masked_fill(~causal, torch.finfo(torch.float32).min)
    actual = torch.zeros(8, 8).masked_fill(~causal, torch.finfo(torch.float16).min)
    m = full_metrics(golden, actual, dtype="float16", rtol=1e-3, atol=1e-5, ulp_dtype="float16")
    assert m.error == 0.0


def test_a_call_that_records_no_output_does_not_stay_open_around_later_modules(
    monkeypatch,
) -> None:
    # each "side" module returns no tensor: its input is recorded (5 % off), its output
    # never is. The modules after it are not inside it: fc's 1 % input error is not
    # explained by side's, and the judge's work stays linear in the records (calls left
    # open took in every later record: 8M scope updates for 4000 records in one step)
    records = []
    for i in range(200):
        records += [
            _rec(f"side{i}.0.forward.input.0", 3 * i, 0.05),
            _rec(f"fc{i}.0.forward.input.0", 3 * i + 1, 0.01 if i == 0 else 0.0),
            _rec(f"fc{i}.0.forward.output.0", 3 * i + 2, 0.0),
        ]
    adds = 0
    real_add = judge._Scopes.add

    def counting(self, *args):
        nonlocal adds
        adds += 1
        return real_add(self, *args)

    monkeypatch.setattr(judge._Scopes, "add", counting)
    statuses = _statuses(records)
    assert statuses["fc0.0.forward.input.0"] == "fail"
    assert adds <= 4 * len(records)


# -- the one pass: local and the why line decided with the status ----------------------------


def test_a_loss_computed_in_bf16_explains_the_call_that_returns_it() -> None:
    # a fixed profile: each record against its dtype's tolerance (bf16: 3 x 1.6e-2), and
    # the loss rule at the loss; the pass decides local and why
    results = [
        _rec("root.0.forward.input.0", 0, 0.0, shape=(4, 8)),
        _rec("head.0.forward.input.0", 1, 0.0),
        _rec("head.0.forward.output.0", 2, 1e-3, dtype="bfloat16"),
        _rec("loss_fn.0.forward.input.0", 3, 1e-3, dtype="bfloat16"),
        _rec(
            "loss_fn.0.forward.input.1",
            4,
            0.0,
            dtype="int64",
            golden_dtype="int64",
            actual_dtype="int64",
        ),
        _rec(
            "loss_fn.0.forward.output.0",
            5,
            1e-3,
            dtype="bfloat16",
            actual_dtype="bfloat16",
            shape=(),
        ),
        _rec("root.0.forward.output.0", 6, 5e-2, dtype="bfloat16", shape=()),
    ]

    verdict = judge_unit(results, get_profile("fixed"))

    (found,) = verdict.candidates
    assert found.result.key == "loss_fn.0.forward.output.0"
    assert "computes the loss in bfloat16" in found.reason
    loss = next(r for r in verdict.results if r.key == found.result.key)
    assert loss.status == "fail" and loss.local is True and loss.expected_error is None
    # the root's output carries the loss's error: decided, but explained by the loss
    root = next(r for r in verdict.results if r.key == "root.0.forward.output.0")
    assert root.local is True
    assert verdict.carried is None  # the expected-error judge did not run


@pytest.mark.parametrize("profile", ["default", "fixed"])
def test_one_pass_names_the_module_that_amplified_and_not_the_one_that_passed_it_on(
    profile: str,
) -> None:
    bad = "fail" if profile == "fixed" else "pass"  # the default profile judges it anew
    results = [
        _rec("a.0.forward.input.0", 0, 0.0),
        _rec("a.0.forward.output.0", 1, 1e-2, status=bad),
        _rec("b.0.forward.input.0", 2, 1e-2, status=bad),
        _rec("b.0.forward.output.0", 3, 1.2e-2, status=bad),
    ]

    verdict = judge_unit(results, get_profile(profile))

    assert [c.result.module for c in verdict.candidates] == ["a"]
    by_key = {r.key: r for r in verdict.results}
    assert by_key["a.0.forward.output.0"].local is True
    # b grew the error it received 1.2x: it passes it on (or, judged anew, passes)
    assert by_key["b.0.forward.output.0"].local is not True


def test_the_verdict_stores_the_error_each_record_was_allowed() -> None:
    """One writer: the status and the allowed error come from the same settlement, which
    guard's margin reads back (the judge's amplification times its expected error; a fixed
    profile's tolerance for the dtype)."""
    from precguard.guard.margin import record_margin

    records = [
        _rec("fc.0.forward.input.0", 0, 1e-3),
        _rec("fc.0.forward.output.0", 1, 5e-3, module_type="Linear"),
        _rec("fc.0.forward.output.1", 2, 2e-2, module_type="Linear"),
    ]
    judged = {r.key: r for r in judge_unit(records, DEFAULT).results}
    ok, bad = judged["fc.0.forward.output.0"], judged["fc.0.forward.output.1"]
    for r in (ok, bad):
        assert r.allowed_error == DEFAULT.amplification * r.expected_error
        margin = record_margin(r, {}, DEFAULT.amplification)
        assert margin is not None and margin.allowed == r.allowed_error
    assert ok.status == "pass" and bad.status == "fail"

    fixed = get_profile("fixed")
    judged = {r.key: r for r in judge_unit(records, fixed).results}
    assert judged["fc.0.forward.input.0"].allowed_error == fixed.for_dtype("float32").rel_l2


# -- the step's calls and the judge's scopes, held by number (docs/compare.md, "One big step")


def test_module_names_are_numbered_once_each_with_every_name_enclosing_them() -> None:
    ids = calls.ModuleIds()
    fc = ids.chain("model.layers.0.mlp.fc0")
    assert len(fc) == 5 and len(set(fc)) == 5  # fc0, mlp, 0, layers, model: innermost first
    assert ids.chain("model.layers.0.mlp.fc1")[1:] == fc[1:]  # same enclosing modules
    assert ids.number("model.layers.0") == fc[2] and ids.number("model") == fc[4]
    assert ids.ancestors("model.layers.0.mlp.fc0") == [*fc, ids.root]
    assert ids.ancestors("root") == [ids.root]
    # names alike but not the same string are not the same module
    names = ["a", "root.a", "a.root", "a..b", "a.", ".a", "a.b", "ab", "a.b.a"]
    numbers = [ids.number(name) for name in names]
    assert len(set(numbers)) == len(names) and ids.root not in numbers
    # thousands of names: the table grows and every number stays the name's, dense from 0
    many = [f"model.layers.{i // 8}.experts.{i % 8}.w{i % 3}" for i in range(5000)]
    first = [ids.number(name) for name in many]
    assert [ids.number(name) for name in reversed(many)] == first[::-1]
    seen = [*many, *names, "model.layers.0.mlp.fc1", "root"]
    every = {i for name in seen for i in ids.chain(name)}
    assert sorted(every | set(fc)) == list(range(ids.count))


def test_a_steps_calls_read_back_their_records_in_capture_order() -> None:
    records = [
        _rec("fc.0.forward.input.0", 0, 0.0, shape=(4, 32)),
        _rec("fc.0.forward.param.0", 1, 0.0, shape=(16, 32)),
        _rec("act.0.forward.input.0", 2, 0.0),  # another call between fc's records
        _rec("fc.0.forward.output.0", 3, 1e-3, status="fail"),
        _rec("fc.1.forward.input.0", 4, 0.0, shape=(4, 8)),  # fc's second call
        _rec("fc.0.backward.output.0", 5, 0.0),
        _rec("fc.0.backward.input.0", 6, 0.0),
    ]
    step = calls.StepCalls(calls.RecordRows(records))  # the rows calls.py holds
    assert not step.opened(("fc", 0))
    for r in records:
        step.add(r)
    assert step.opened(("fc", 0)) and step.opened(("fc", 1)) and not step.opened(("fc", 2))
    assert [r.seq for r in step.reads(("fc", 0))] == [0, 1]
    assert [r.seq for r in step.reads(("fc", 1))] == [4]
    assert [r.seq for r in step.output_grads(("fc", 0))] == [5]
    assert step.reads(("nothing", 0)) == [] and step.output_grads(("act", 0)) == []
    assert step.reduction(("fc", 0), backward=False) == 32
    assert step.reduction(("fc", 1), backward=False) == 8
    assert step.input_grads
    # fc's forward call holds the failing output; its backward call reads its forward
    # records, the failing one not among them (an output is not what backward consumes)
    failing = list(step.failing_calls())
    assert [(c.module, c.phase, c.call) for c in failing] == [("fc", "forward", 0)]
    assert [r.seq for r in failing[0].consumed] == [0]
    assert [r.seq for r in failing[0].params] == [1]
    assert [r.seq for r in failing[0].produced] == [3]
    assert failing[0].k == 32 and failing[0].module_type == "Module"


def test_a_modules_scope_keeps_the_running_maxima_of_what_joined_it() -> None:
    scopes = judge._Scopes()
    assert not scopes.used(3)
    assert scopes.get(3) == judge._Scope() and scopes.used(3)  # read: used, as a defaultdict's
    bf16 = judge._Passed(1e-3, 2e-3, 0.0, 0.0, "bfloat16")
    f32 = judge._Passed(5e-3, 1e-4, 1e-5, 2e-5, "float32")
    scopes.add(7, f32)
    scopes.add(7, bf16)
    scopes.add(7, judge._Passed(0.0, 0.0, 0.0, 0.0, None))  # no dtype: the least stays
    assert scopes.get(7) == judge._Scope(5e-3, 2e-3, "bfloat16", 2e-5)
    assert not scopes.used(5) and not scopes.used(10**6)
    scopes.reset(7)
    assert scopes.get(7) == judge._Scope() and scopes.used(7)


def test_a_call_numbered_before_its_records_settle_is_not_read() -> None:
    # the judge numbers every call of a step before its records settle (as calls.add
    # will): a backward call with none of its own yet decides nothing, even where the
    # forward records it would read hold a failing one
    fc_in = _rec("fc.0.forward.input.0", 0, 1e-3, status="fail")
    fc_out = _rec("fc.0.forward.output.0", 1, 0.0)
    grad = _rec("fc.0.backward.output.0", 2, 0.0)
    step = calls.StepCalls(calls.RecordRows([fc_in, fc_out, grad]))
    step.number(grad)
    step.add(fc_in)
    step.add(fc_out)
    failing = list(step.failing_calls())
    assert [(c.module, c.phase, [r.seq for r in c.consumed]) for c in failing] == [
        ("fc", "forward", [0])
    ]
