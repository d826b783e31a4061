"""The evidence of a flush is encoded in one loop: the same fields as one tensor at a time.

``all_record_fields`` inlines ``encode`` (capture runs it for two fields of every
record at every flush); these tests hold it to ``record_fields``' contract: the
values little-endian base64, whatever the array's byte order.
"""

from __future__ import annotations

import base64

import numpy as np
import pytest
import torch

from precguard.capture.evidence import all_record_fields, encode, plan_for, record_fields


def _decoded(text: str, dtype: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=np.dtype(dtype).newbyteorder("<"))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("byteorder", ["<", ">"])
def test_a_flushs_evidence_decodes_to_the_gathered_values(dtype, byteorder):
    with_positions = plan_for((2, 300, 8), torch.device("cpu"), True)
    sample_only = plan_for((40, 7), torch.device("cpu"), False)
    rng = np.random.default_rng(0)
    gathered = []
    for plan in (with_positions, sample_only):
        size = plan.host_index.size + plan.bins
        gathered.append(
            (plan, rng.standard_normal(size).astype(np.dtype(dtype).newbyteorder(byteorder)))
        )
    fields = all_record_fields([gathered[0], None, gathered[1]])
    assert fields[1] is None
    name = np.dtype(dtype).name
    for (plan, values), got in zip(gathered, (fields[0], fields[2]), strict=True):
        assert got == record_fields(plan, values)
        n = plan.host_index.size
        assert got["sample"] == {"seed": plan.seed, "dtype": name, "values": encode(values[:n])}
        np.testing.assert_array_equal(_decoded(got["sample"]["values"], name), values[:n])
        if plan.seq_dim is None:
            assert "positions" not in got
        else:
            assert got["positions"]["length"] == 300
            np.testing.assert_array_equal(_decoded(got["positions"]["norms"], name), values[n:])
