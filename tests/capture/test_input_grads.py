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
    # fc and gate read the same x: their sum is recorded for the model only
    assert "root.0.backward.input.0" in keys
    assert "fc.0.backward.input.0" not in keys and "gate.0.backward.input.0" not in keys
    # act modified its input in place: the gradient of what it read no longer exists as
    # a tensor a hook could watch without changing the graph, so nothing is recorded
    assert "act.0.backward.input.0" not in keys
    assert "act.0.backward.output.0" in keys


def test_input_gradient_is_the_gradient_of_the_input(tiny_llama, input_ids, tmp_path):
    with precguard.monitor(tiny_llama, out=tmp_path / "run", tensors=["model.layers.1.mlp.*"]):
        tiny_llama(input_ids, labels=input_ids).loss.backward()
    run = precguard.load_run(tmp_path / "run")
    records = {r.key: r for r in run.records()}

    down = records["model.layers.1.mlp.down_proj.0.backward.input.0"]
    assert down.phase == "backward" and down.role == "input" and down.name == "args.0"
    assert down.shape == records["model.layers.1.mlp.down_proj.0.forward.input.0"].shape
    # the input gradient of a Linear is its output gradient times its weight
    from precguard.compare.tensors import TensorStore

    store = TensorStore(run.path)
    grad_out = store.tensor(records["model.layers.1.mlp.down_proj.0.backward.output.0"])
    weight = tiny_llama.get_submodule("model.layers.1.mlp.down_proj").weight.detach()
    expected = grad_out @ weight
    got = store.tensor(down)
    assert torch.allclose(got, expected, rtol=1e-5, atol=1e-7 * expected.abs().max().item())
    store.close()

    # q/k/v_proj read one hidden state: no one of them made its gradient; self_attn did
    assert "model.layers.1.self_attn.q_proj.0.backward.input.0" not in records
    assert "model.layers.1.self_attn.0.backward.input.0" in records
    # the decoder layer and its first norm read the same tensor: both are recorded,
    # the norm (inner) first, so a fault in the norm's backward is charged to the norm
    norm = records["model.layers.1.input_layernorm.0.backward.input.0"]
    layer = records["model.layers.1.0.backward.input.0"]
    assert norm.seq < layer.seq and norm.stats == layer.stats


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
