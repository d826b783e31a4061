"""The long-run training monitor behind ``precguard.watch(model, optimizer, every=N, out=DIR)``.

The package is not called ``watch``: the function ``precguard.watch`` is the
API, and a subpackage of the same name would replace it as an attribute of
``precguard`` once imported (the reason ``compare`` the function became
``compare_runs``, docs/architecture.md). See docs/watch.md.

* :mod:`~precguard.training.handle`: :func:`watch` and :class:`WatchHandle`;
* :mod:`~precguard.training.pulse`: the per-step scalars, on the device;
* :mod:`~precguard.training.detect`: robust z-score anomaly detectors;
* :mod:`~precguard.training.alerts`: :class:`Alert` and :class:`WatchOptions`;
* :mod:`~precguard.training.hf`: the ``transformers.Trainer`` callback;
* :mod:`~precguard.training.report`: reading a watch directory, HTML and CSV.
"""

from __future__ import annotations

from precguard.training.alerts import Alert, WatchOptions
from precguard.training.handle import WatchHandle, watch

__all__ = ["Alert", "WatchHandle", "WatchOptions", "watch"]
