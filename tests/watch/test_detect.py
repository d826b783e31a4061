"""The detectors on synthetic series: a spike over its own history alerts; a trend does not."""

from __future__ import annotations

import math

import numpy as np

from precguard.training.alerts import WatchOptions
from precguard.training.detect import Detectors
from precguard.training.pulse import StepScalars


def _steps(losses: list[float], norms: list[float]) -> list[StepScalars]:
    return [
        StepScalars(step=i, loss=x, grad_norm=g, grad_norms=[g], update_ratios=[1e-3])
        for i, (x, g) in enumerate(zip(losses, norms, strict=True))
    ]


def _alerts(scalars: list[StepScalars]) -> list[tuple[str, int]]:
    detectors = Detectors(["w"], WatchOptions(window=50, min_history=10))
    return [(a.kind, a.step) for s in scalars for a in detectors.observe(s)]


def test_a_loss_spike_and_a_grad_norm_spike_alert_at_their_step() -> None:
    rng = np.random.default_rng(0)
    losses = list(2.0 + 0.01 * rng.standard_normal(40))
    norms = list(1.0 + 0.05 * rng.standard_normal(40))
    losses[30] = 3.0  # +50 %: ~35 robust sigmas of the 2 % floor
    norms[35] = 8.0  # 8x the median: log 2.1, ~20 sigmas of the 0.1 floor
    found = _alerts(_steps(losses, norms))
    assert ("loss_spike", 30) in found
    assert ("grad_norm_spike", 35) in found and ("layer_grad_norm_jump", 35) in found
    assert len(found) == 3


def test_a_falling_loss_and_a_slow_drift_raise_nothing() -> None:
    losses = [5.0 * math.exp(-i / 10) for i in range(60)]  # training working
    norms = [1.0 * 1.02**i for i in range(60)]  # 2 % a step: a trend, not a jump
    assert _alerts(_steps(losses, norms)) == []


def test_nothing_alerts_before_min_history_steps() -> None:
    losses = [1.0] * 5 + [100.0]
    assert _alerts(_steps(losses, [1.0] * 6)) == []


def test_the_column_median_ignores_missing_values_as_numpy_does() -> None:
    import warnings

    from precguard.training.detect import _column_nanmedian

    rng = np.random.default_rng(0)
    a = rng.standard_normal((100, 6))
    a[rng.random(a.shape) < 0.3] = np.nan
    a[:, 3] = np.nan  # a layer with no history yet
    a[:51, 4] = np.nan  # an odd count
    median, count = _column_nanmedian(a)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        np.testing.assert_array_equal(median, np.nanmedian(a, axis=0))
    np.testing.assert_array_equal(count, np.sum(~np.isnan(a), axis=0))
