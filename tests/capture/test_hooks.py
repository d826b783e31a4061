"""The one hook layer (precguard.capture.hooks): what every feature attaches through.

A feature sees each module call by name, each op with the module running it,
the gradients; it can replace an output when it asks to; a callback that fails
is reported and the forward pass goes on; the handle takes everything off,
also when the block raised; and the first NaN/Inf is blamed on the module that
made it, not on the ones it flowed through.
"""

from __future__ import annotations

import functools
import logging

import pytest
import torch
from torch import nn

from precguard.capture.hooks import (
    NonFiniteOrigin,
    has_nonfinite,
    on_calls,
    on_ops,
    on_param_grads,
    on_tensor_grad,
    replace_forward,
)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up = nn.Linear(4, 8)
        self.act = nn.GELU()
        self.down = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
        return x + self.down(self.act(self.up(x))) * scale


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(Block(), nn.LayerNorm(4))


def _no_hooks(m: nn.Module) -> bool:
    return all(
        not mod._forward_pre_hooks and not mod._forward_hooks and "forward" not in mod.__dict__
        for mod in m.modules()
    )


def test_each_module_call_is_seen_by_name_and_the_output_is_bitwise_unchanged() -> None:
    m, x = model(), torch.randn(3, 4)
    plain = m(x)
    seen: list[tuple[str, str]] = []
    with on_calls(
        m,
        lambda name, mod, args, kwargs: seen.append(("pre", name)),
        lambda name, mod, args, kwargs, out: seen.append(("post", name)),
    ):
        hooked = m(x)
    assert torch.equal(hooked, plain)
    assert [n for kind, n in seen if kind == "pre"] == [
        "root", "0", "0.up", "0.act", "0.down", "1"
    ]  # fmt: skip
    assert seen[-1] == ("post", "root")
    assert _no_hooks(m)


def test_keyword_arguments_reach_the_callback_and_a_chosen_module_only_is_hooked() -> None:
    m = model()
    kwargs_seen: list[dict] = []
    with on_calls(m, lambda n, mod, a, k: kwargs_seen.append(k), modules=["0"]):
        m[0](torch.randn(2, 4), scale=0.5)
        m(torch.randn(2, 4))
    assert kwargs_seen == [{"scale": 0.5}, {}]
    with pytest.raises(KeyError, match="no module named 'nope'"):
        on_calls(m, lambda *a: None, modules=["nope"])
    assert _no_hooks(m)


def test_callbacks_without_the_name_are_torchs_hooks_themselves_after_a_set_up_per_module() -> None:
    # name_first=False: what the Monitor uses, the cheapest hook (no frame of the layer
    # between torch and the callback); bind runs once per module, its result not passed
    m, x = model(), torch.randn(3, 4)
    plain = m(x)
    bound: list[str] = []
    seen: list[tuple[str, nn.Module]] = []

    def pre(mod: nn.Module, args: tuple, kwargs: dict) -> None:
        seen.append(("pre", mod))

    def post(mod: nn.Module, args: tuple, kwargs: dict, out: object) -> None:
        seen.append(("post", mod))

    handle = on_calls(
        m, pre, post, errors="raise", name_first=False, bind=lambda n, mod: bound.append(n)
    )
    with handle:
        hooked = m(x)
        assert m[0].up._forward_pre_hooks[next(iter(m[0].up._forward_pre_hooks))] is pre
    assert torch.equal(hooked, plain)
    assert bound == ["root", "0", "0.up", "0.act", "0.down", "1"]
    assert [mod for kind, mod in seen if kind == "pre"] == [
        m, m[0], m[0].up, m[0].act, m[0].down, m[1]
    ]  # fmt: skip
    assert pre._torchdynamo_disable  # kept out of dynamo's tracing, as every callback
    assert _no_hooks(m)
    with pytest.raises(ValueError, match="errors='raise'"):
        on_calls(m, pre, name_first=False)
    assert _no_hooks(m)
    # a callable without code of its own (a partial) is marked through a function around it
    tagged: list[str] = []
    tag_x = functools.partial(lambda tag, *a: tagged.append(tag), "x")
    partial_handle = on_calls(m, tag_x, errors="raise", name_first=False, modules=["0.up"])
    with partial_handle:
        m(x)
        hook = next(iter(m[0].up._forward_pre_hooks.values()))
        assert hook._torchdynamo_disable
    assert tagged == ["x"] and partial_handle.removed and _no_hooks(m)


def test_a_failing_callback_is_reported_once_and_the_forward_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    m, x = model(), torch.randn(3, 4)
    plain = m(x)

    def broken(name: str, *_: object) -> None:
        raise RuntimeError(f"bug in the callback at {name}")

    with caplog.at_level(logging.ERROR), on_calls(m, post=broken):
        out1, out2 = m(x), m(x)
    assert torch.equal(out1, plain) and torch.equal(out2, plain)
    failures = [r for r in caplog.records if "hook_failed" in r.getMessage()]
    assert len(failures) == 6  # one per module and hook, not one per call
    assert "bug in the callback at 0.up" in caplog.text


def test_errors_raise_propagates_and_the_hooks_come_off_with_the_exception() -> None:
    m = model()

    def broken(*_: object) -> None:
        raise RuntimeError("stop")

    with pytest.raises(RuntimeError, match="stop"), on_calls(m, broken, errors="raise"):
        m(torch.randn(2, 4))
    assert _no_hooks(m)


def test_a_post_callback_may_replace_the_output_when_it_asks_for_errors() -> None:
    m, x = model(), torch.randn(3, 4)
    with on_calls(
        m,
        post=lambda name, mod, args, out: torch.zeros_like(out),
        modules=["0"],
        with_kwargs=False,
        errors="raise",
    ):
        out = m(x)
    assert torch.equal(out, m[1](torch.zeros(3, 4)))  # the norm saw the replaced output


def test_remove_is_idempotent_and_leaves_the_model_as_it_was() -> None:
    m, x = model(), torch.randn(3, 4)
    plain = m(x)
    handle = on_calls(m, lambda *a: None, lambda *a: None)
    handle.remove()
    handle.remove()
    assert handle.removed and _no_hooks(m)
    assert torch.equal(m(x), plain)


def test_ops_are_seen_with_the_module_running_them_and_a_mode_is_entered_once() -> None:
    m, x = model(), torch.randn(3, 4)
    plain = m(x)
    seen: list[tuple[str, str]] = []
    handle = on_ops(
        lambda op, args, kwargs, out, module: seen.append((op, module)),
        model=m,
        ops={"linear", "gelu", "layer_norm"},
    )
    with handle:
        out = m(x)
    assert torch.equal(out, plain)
    assert seen == [
        ("linear", "0.up"),
        ("gelu", "0.act"),
        ("linear", "0.down"),
        ("layer_norm", "1"),
    ]
    assert _no_hooks(m)
    with pytest.raises(RuntimeError, match="entered once"):
        handle.__enter__()
    seen.clear()
    m(x)  # removed: nothing watched any more
    assert seen == []


def test_ops_at_the_aten_level_name_the_dispatched_op() -> None:
    seen: list[str] = []
    with on_ops(lambda op, *_: seen.append(op), level="aten", ops={"mm", "addmm"}):
        nn.Linear(4, 4)(torch.randn(2, 4))
    assert seen == ["addmm"]


def test_an_op_can_be_run_another_way_inside_the_block_only() -> None:
    x = torch.randn(5)

    def zero_sums(func: object, args: tuple, kwargs: dict) -> torch.Tensor:
        return torch.zeros(()) if func is torch.sum else func(*args, **kwargs)  # type: ignore[operator]

    with on_ops(run=zero_sums):
        inside, doubled = torch.sum(x), x * 2
    assert torch.equal(inside, torch.zeros(()))
    assert torch.equal(doubled, x + x)
    assert torch.equal(torch.sum(x), x.sum())


def test_replace_forward_answers_the_calls_and_restores_the_users_own_forward() -> None:
    lin = nn.Linear(2, 2)
    own = lin.forward
    lin.forward = own  # the user's instance attribute (a wrapper of theirs)
    with replace_forward(lin, lambda x: x * 0):
        assert torch.equal(lin(torch.ones(1, 2)), torch.zeros(1, 2))
    assert lin.__dict__["forward"] is own
    plain = nn.Linear(2, 2)
    with replace_forward(plain, lambda x: x):
        pass
    assert "forward" not in plain.__dict__


def test_gradients_are_seen_once_accumulated_and_as_they_reach_a_tensor() -> None:
    m, x = model(), torch.randn(3, 4)
    params: list[str] = []
    grads: list[torch.Tensor] = []
    with on_param_grads(m.named_parameters(), lambda name, p: params.append(name)):
        out = m(x)
        on_tensor_grad(out, grads.append)
        out.sum().backward()
    assert sorted(params) == sorted(n for n, _ in m.named_parameters())
    assert len(grads) == 1 and torch.equal(grads[0], torch.ones_like(out))


def test_the_first_nan_is_blamed_on_the_module_that_made_it_not_the_ones_downstream() -> None:
    m = model()
    with torch.no_grad():
        m[0].down.weight[0, 0] = float("inf")
    origin = NonFiniteOrigin()
    blamed: list[str] = []

    def post(name: str, _m: nn.Module, args: tuple, out: torch.Tensor) -> None:
        if origin.call(name, not has_nonfinite(args), not has_nonfinite(out)):
            blamed.append(name)

    with on_calls(m, post=post, with_kwargs=False, errors="raise"):
        m(torch.randn(3, 4))
    # 0.down made the Inf; block 0 and the norm only passed it on (the norm's NaN too)
    assert blamed == ["0.down"]
    assert origin.found == {"forward": "0.down"}


def test_the_origin_rule_from_records_inputs_then_outputs_one_per_phase() -> None:
    origin = NonFiniteOrigin()
    origin.inputs(("a", 0), True)
    assert not origin.output(("a", 0), True)
    origin.inputs(("b", 0), True)
    assert origin.output(("b", 0), False)  # finite inputs, bad output: the origin
    origin.inputs(("c", 0), False)
    assert not origin.output(("c", 0), False)  # handed a NaN: not an origin
    assert origin.first("g.0", False) and not origin.first("g.1", False)
    origin.reset()
    assert origin.output(("c", 0), False)  # the next step looks afresh
