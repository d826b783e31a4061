"""Capture leaves the user's tensors' storages as it found them.

``tensor.numpy()`` marks a storage non-resizable for good; FSDP2 frees unsharded
parameters with ``storage.resize_(0)`` and failed under capture ("Trying to resize
storage that is not resizable") until the statistics read tensors another way.
"""

from __future__ import annotations

import numpy as np
import torch

import precguard
from precguard.capture.stats import host_view


def test_statistics_capture_leaves_every_storage_resizable(tmp_path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    x = torch.randn(4, 16, 64)
    with precguard.monitor(model, out=tmp_path / "run"):
        y = model(x)
    for t in (x, y, *model.parameters()):
        assert t.untyped_storage().resizable()
    weight = model[0].weight
    weight.data.untyped_storage().resize_(0)  # what FSDP2's free_storage does


def test_the_host_view_reads_what_numpy_would_for_any_layout() -> None:
    base = torch.randn(6, 10, dtype=torch.float64)
    for t in (base, base.t(), base[1:, 2:7], base[:, ::3], base.expand(2, 6, 10), base[0, 0]):
        np.testing.assert_array_equal(host_view(t), t.clone().numpy())
    assert host_view(torch.empty(0, 3)).shape == (0, 3)
    assert base.untyped_storage().resizable()
