"""Gradients w.r.t. module inputs: recorded without changing a bit of what the model computes."""

from __future__ import annotations

import torch
from torch import nn

import precguard


class InPlace(nn.Module):
    """Reads its input twice and hands it to a module that modifies it in place."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)
        self.gate = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        y = self.act(h)  # modifies h in place
        return y * self.gate(x) + x


def _train_step(model: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
    x = x.clone().requires_grad_(True)
    out = model(x)
    out.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad(set_to_none=True)
    return out.detach(), grads


def test_input_grads_keep_outputs_and_grads_bitwise_equal_with_in_place_ops(tmp_path):
    torch.manual_seed(0)
    model = InPlace()
    x = torch.randn(4, 8)
    plain_out, plain_grads = _train_step(model, x)

    with precguard.monitor(model, out=tmp_path / "run"):
        out, grads = _train_step(model, x)

    assert torch.equal(plain_out, out)
    for g0, g in zip(plain_grads, grads, strict=True):
        assert torch.equal(g0, g)
    keys = {r.key for r in precguard.load_run(tmp_path / "run").records()}
    # fc and gate read the same x: each its own part, the model the whole
    assert {"root.0.backward.input.0", "fc.0.backward.input.0", "gate.0.backward.input.0"} <= keys
    # act modified its input in place: the gradient of what it read no longer exists as
    # a tensor a hook could watch without changing the graph, so nothing is recorded
    assert "act.0.backward.input.0" not in keys
    assert "act.0.backward.output.0" in keys


def test_input_gradient_is_the_modules_own(tiny_llama, input_ids, tmp_path):
    with precguard.monitor(tiny_llama, out=tmp_path / "run", tensors=["model.layers.1.*"]):
        tiny_llama(input_ids, labels=input_ids).loss.backward()
    run = precguard.load_run(tmp_path / "run")
    records = {r.key: r for r in run.records()}

    def grad_in(module: str) -> torch.Tensor:
        rec = records[f"{module}.0.backward.input.0"]
        assert rec.phase == "backward" and rec.role == "input"
        assert rec.shape == records[f"{module}.0.forward.input.0"].shape
        return run.tensor(rec)

    def linear_grad_in(module: str) -> torch.Tensor:
        # a Linear's own input gradient: its output gradient times its weight
        grad_out = run.tensor(records[f"{module}.0.backward.output.0"])
        return grad_out @ tiny_llama.get_submodule(module).weight.detach()

    def close(a: torch.Tensor, b: torch.Tensor) -> bool:
        return torch.allclose(a, b, rtol=1e-5, atol=1e-6 * b.abs().max().item())

    attn = "model.layers.1.self_attn"
    assert close(grad_in(f"{attn}.o_proj"), linear_grad_in(f"{attn}.o_proj"))
    # q/k/v_proj read one hidden state: each is charged its own part of its gradient,
    # and the three parts add up to the gradient self_attn sends back
    parts = [linear_grad_in(f"{attn}.{p}") for p in ("q_proj", "k_proj", "v_proj")]
    for p, part in zip(("q_proj", "k_proj", "v_proj"), parts, strict=True):
        assert close(grad_in(f"{attn}.{p}"), part)
        assert not close(part, grad_in(attn))
    assert close(grad_in(attn), parts[0] + parts[1] + parts[2])
    # the norm is charged its own part, not the residual's: the layer gets both
    norm = records["model.layers.1.input_layernorm.0.backward.input.0"]
    layer = records["model.layers.1.0.backward.input.0"]
    assert norm.seq < layer.seq and norm.stats != layer.stats
    run.tensors.close()


def test_input_grads_off(tiny_llama, input_ids, tmp_path):
    with precguard.monitor(tiny_llama, out=tmp_path / "run", input_grads=False):
        tiny_llama(input_ids, labels=input_ids).loss.backward()
    roles = {(r.phase, r.role) for r in precguard.load_run(tmp_path / "run").records()}
    assert ("backward", "input") not in roles
    assert ("backward", "output") in roles and ("backward", "grad") in roles


class PassesItsWeight(nn.Module):
    """Hands a parameter (a leaf that lives across steps) to a submodule as an input."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.full((8,), 2.0))
        self.apply_scale = Scale()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.apply_scale(x, self.scale)


class Scale(nn.Module):
    def forward(self, x: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
        return x * s


def test_a_leaf_input_is_watched_once_per_step_and_unhooked_after(tmp_path):
    model = PassesItsWeight()
    x = torch.randn(4, 8, requires_grad=True)

    with precguard.monitor(model, out=tmp_path / "run") as mon:
        for _ in range(3):
            model(x).sum().backward()
            mon.step()

    records = list(precguard.load_run(tmp_path / "run").records())
    grads_of_s = [r for r in records if r.key == "apply_scale.0.backward.input.1"]
    assert [r.step for r in grads_of_s] == [0, 1, 2]  # one per step, none repeated
    assert not model.scale._backward_hooks and not x._backward_hooks
