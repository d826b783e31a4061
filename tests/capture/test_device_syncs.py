"""On an accelerator, statistics stay on the device until the step ends (issue 41, item 1).

A host sync (``.item()``, ``.tolist()``, ``bool(t)``, a copy to the CPU) stalls
an accelerator's queue: one per module call would cost a 70B model's step
thousands of stalls. The accelerator path (``StatsBuffer(defer=True)``, what a
recording takes on any device that is not the CPU) runs here on the CPU as a
fake device: a torch function mode counts every call that would sync the host
with a device. A monitored forward may add a fixed number of them, the one
transfer at the step's flush, however many modules it has.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import precguard
from precguard.capture.stats import StatsBuffer

#: the Tensor methods that wait for a device's queue and copy to the host
_SYNCS = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.numpy,
    torch.Tensor.cpu,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
}


def _to_host(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    """``t.to("cpu", ...)``, ``t.to(device=torch.device("cpu"))``: a copy to the host."""
    if func is not torch.Tensor.to:
        return False
    wanted = [*args[1:], kwargs.get("device")]
    return any(
        (isinstance(a, str) and a.startswith("cpu"))
        or (isinstance(a, torch.device) and a.type == "cpu")
        for a in wanted
    )


class HostSyncs(TorchFunctionMode):
    """Counts the calls inside the block that would sync the host on an accelerator."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_function__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        kwargs = kwargs or {}
        if func in _SYNCS or _to_host(func, args, kwargs):
            self.count += 1
        return func(*args, **kwargs)


class Tower(nn.Module):
    """``depth`` blocks of (Linear, LayerNorm, GELU): three module calls per block."""

    def __init__(self, depth: int) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(16, 16), nn.LayerNorm(16), nn.GELU()) for _ in range(depth)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = x + block(x)
        return x


def syncs_added_by_monitoring(depth: int, tmp_path: Any) -> int:
    """Host syncs of a monitored forward on the fake device, minus the plain forward's."""
    torch.manual_seed(0)
    model, x = Tower(depth), torch.randn(2, 8, 16)
    with torch.no_grad(), HostSyncs() as plain:
        model(x)
    with precguard.monitor(model, out=tmp_path / f"depth{depth}") as handle:
        handle.recording._stats = StatsBuffer(defer=True)  # the accelerator path
        with torch.no_grad():
            model(x)  # step 0: the evidence's sample indices go to the device once
            with HostSyncs() as monitored:
                model(x)  # step 1: the root's call ends the step, one flush
    return monitored.count - plain.count


def test_the_counter_sees_a_sync() -> None:
    with HostSyncs() as syncs:
        t = torch.ones(3)
        t.sum().item()
        bool(t.all())
        t.to("cpu")
        t.to(torch.float64)  # a dtype change is no copy to the host
    assert syncs.count == 3


def test_monitoring_on_a_device_syncs_once_per_step_not_once_per_module(tmp_path) -> None:
    shallow = syncs_added_by_monitoring(2, tmp_path)
    deep = syncs_added_by_monitoring(8, tmp_path)  # 18 more module calls
    assert deep == shallow
    # the flush: the statistics' floats and counts and the evidence, a transfer each,
    # and reading them out
    assert shallow <= 6
