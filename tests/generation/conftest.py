"""Generation tests run many tiny forwards: one intra-op thread each.

On a shared, loaded machine torch's worker threads spin against each other and a
64-wide Linear takes milliseconds instead of microseconds; one thread keeps each
forward at its real cost. Restored after each test.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)
