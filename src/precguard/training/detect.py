"""Online anomaly detection over the per-step scalars: robust z-scores over a window.

A value is anomalous when it leaves its *own* recent history: its robust
z-score ``(x - median) / max(1.4826 MAD, floor)`` over the last ``window``
steps exceeds ``z_threshold`` (median and MAD, not mean and std, so one
spike in the window does not hide the next one). The loss is scored on its
value, norms and ratios on their logarithm (a 10x jump is the same size
whether the norm is 1e-3 or 1e3). Only rises alert: a loss or a norm that
falls is what training is for.

``floor`` keeps a nearly constant history (Adam's update/param ratio at a
fixed learning rate) from calling the last digit's wobble an anomaly: a
logarithmic series must move by at least ``z_threshold x 0.1`` (a factor
of 1.8 at the default threshold), the loss by ``z_threshold x 2 %`` of its
median.

Non-finite values are not scored and never enter a history; the first step
with a NaN/Inf loss, gradient norm or update ratio is its own alert, naming
each parameter involved; the next non-finite alert needs a finite step first.
"""

from __future__ import annotations

import math

import numpy as np

from precguard.training.alerts import Alert, LayerEvidence, WatchOptions
from precguard.training.pulse import StepScalars

#: the smallest robust scale of a logarithmic series (norms, ratios)
LOG_FLOOR = 0.1
#: the smallest robust scale of the loss, relative to its median
LOSS_FLOOR = 0.02


def _column_nanmedian(a: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The median of each column ignoring NaN (NaN for an all-NaN column), and the counts.

    One sort (NaN sorts last) and two gathers: ``np.nanmedian`` takes a masked-array
    path that costs ~10x this on the small arrays a watch keeps.
    """
    n = np.sum(~np.isnan(a), axis=0)
    ordered = np.sort(a, axis=0)
    lo = np.maximum((n - 1) // 2, 0)[None, :]
    hi = np.maximum(n // 2, 0)[None, :]
    median = 0.5 * (np.take_along_axis(ordered, lo, 0) + np.take_along_axis(ordered, hi, 0))[0]
    return np.where(n > 0, median, np.nan), n


class RobustHistory:
    """The last ``window`` values of several series and their robust z-scores, vectorized."""

    def __init__(self, series: int, window: int) -> None:
        self._buf = np.full((window, series), np.nan)
        self._count = 0

    def score(
        self,
        x: np.ndarray,
        floor: float | np.ndarray,
        min_history: int,
        *,
        rel_floor: float | np.ndarray = 0.0,
    ) -> tuple[np.ndarray, np.ndarray]:
        """``(z, median)`` of ``x`` against the history; z is NaN where history is short.

        The robust scale is at least ``floor + rel_floor x |median|``.
        """
        median, enough_n = _column_nanmedian(self._buf)
        mad, _n = _column_nanmedian(np.abs(self._buf - median))
        scale = np.maximum(1.4826 * mad, floor + rel_floor * np.abs(median))
        z = (x - median) / scale
        enough = enough_n >= min_history
        return np.where(enough & np.isfinite(x), z, np.nan), median

    def push(self, x: np.ndarray) -> None:
        """Add one step's values (non-finite ones are left out)."""
        self._buf[self._count % len(self._buf)] = np.where(np.isfinite(x), x, np.nan)
        self._count += 1


def _array(values: list[float | None]) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=np.float64)


def _log(x: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > 0, np.log(np.where(x > 0, x, 1.0)), np.nan)


class Detectors:
    """Every detector of one watch: feed :meth:`observe` each step's scalars, get alerts."""

    def __init__(self, layers: list[str], options: WatchOptions) -> None:
        self.layers = layers
        self.modules = [name.rpartition(".")[0] or "root" for name in layers]
        self.options = options
        n = len(layers)
        # one history for every series, one sort per step: the loss, the global
        # gradient norm (log), each layer's gradient norm (log), each layer's ratio (log)
        self._history = RobustHistory(2 + 2 * n, options.window)
        self._floor = np.array([1e-12] + [LOG_FLOOR] * (1 + 2 * n))
        self._rel_floor = np.array([LOSS_FLOOR] + [0.0] * (1 + 2 * n))
        self._in_nonfinite = False

    @property
    def in_nonfinite(self) -> bool:
        """True after a non-finite step until a finite one: the next one raises no alert."""
        return self._in_nonfinite

    def observe(self, s: StepScalars) -> list[Alert]:
        """Score one step against the history, then add it to the history."""
        alerts: list[Alert] = []
        nonfinite = self._nonfinite(s)
        if nonfinite is not None:
            alerts.append(nonfinite)
        opts = self.options
        n = len(self.layers)
        raw = _array([s.loss, s.grad_norm, *s.grad_norms, *s.update_ratios])
        x = np.concatenate([raw[:1], _log(raw[1:])])
        z_all, median_all = self._history.score(
            x, self._floor, opts.min_history, rel_floor=self._rel_floor
        )
        z_loss, m_loss = z_all[0], median_all[0]
        gnorm, z_g, m_g = x[1:2], z_all[1], median_all[1]
        if z_loss > opts.z_threshold:
            alerts.append(
                Alert(
                    kind="loss_spike",
                    step=s.step,
                    message=f"loss {s.loss:.6g} at step {s.step} is {z_loss:.1f} robust sigmas "
                    f"above its recent median {m_loss:.6g}",
                    value=s.loss,
                    median=float(m_loss),
                    z=float(z_loss),
                )
            )
        if z_g > opts.z_threshold:
            alerts.append(
                Alert(
                    kind="grad_norm_spike",
                    step=s.step,
                    message=f"global grad norm {s.grad_norm:.6g} at step {s.step} is "
                    f"{math.exp(gnorm[0] - m_g):.3g}x its recent median (z {z_g:.1f})",
                    value=s.grad_norm,
                    median=math.exp(m_g),
                    z=float(z_g),
                )
            )
        for kind, part, what in (
            ("update_ratio_jump", slice(2 + n, None), "update/param ratio"),
            ("layer_grad_norm_jump", slice(2, 2 + n), "gradient norm"),
        ):
            z = z_all[part]
            hit = np.flatnonzero(z > opts.z_threshold)
            if hit.size:
                alerts.append(
                    self._layer_alert(kind, s.step, what, hit, x[part], z, median_all[part])
                )
        self._history.push(x)
        return alerts

    def _layer_alert(
        self,
        kind: str,
        step: int,
        what: str,
        hit: np.ndarray,
        x: np.ndarray,
        z: np.ndarray,
        median: np.ndarray,
    ) -> Alert:
        layers = [
            LayerEvidence(
                layer=self.layers[i],
                module=self.modules[i],
                value=math.exp(x[i]),
                median=math.exp(median[i]),
                z=float(z[i]),
            )
            for i in hit
        ]
        worst = max(layers, key=lambda e: e.z or 0.0)
        factor = (worst.value or 0.0) / (worst.median or 1.0)
        more = f" and {len(layers) - 1} more" if len(layers) > 1 else ""
        return Alert(
            kind=kind,  # type: ignore[arg-type]
            step=step,
            message=f"{what} of {worst.layer}{more} jumped at step {step}: {factor:.3g}x its "
            f"recent median (z {worst.z:.1f})",
            layers=layers,
        )

    def _nonfinite(self, s: StepScalars) -> Alert | None:
        if not s.nonfinite:
            self._in_nonfinite = False
            return None
        if self._in_nonfinite:
            return None
        self._in_nonfinite = True
        bad = [
            i
            for i in range(len(self.layers))
            if any(
                v is not None and not math.isfinite(v)
                for v in (s.grad_norms[i], s.update_ratios[i])
            )
        ]
        layers = [
            LayerEvidence(
                layer=self.layers[i],
                module=self.modules[i],
                # the non-finite one: the gradient norm, else the update ratio
                value=s.grad_norms[i] if _bad(s.grad_norms[i]) else s.update_ratios[i],
            )
            for i in bad
        ]
        grads = [self.layers[i] for i in bad if _bad(s.grad_norms[i])]
        updates = [self.layers[i] for i in bad if _bad(s.update_ratios[i])]
        # found by scanning the parameters when no per-layer number was non-finite: no
        # per-layer value to show
        scanned = [i for i in s.nonfinite_params if i not in bad]
        layers += [
            LayerEvidence(layer=self.layers[i], module=self.modules[i], value=None) for i in scanned
        ]
        where = []
        if s.loss is not None and not math.isfinite(s.loss):
            where.append(f"the loss is {s.loss}")
        if _bad(s.grad_norm) and not any(_bad(g) for g in s.grad_norms):
            where.append(f"the global gradient norm is {s.grad_norm}")
        if scanned:
            where.append(
                f"the parameters of {_names([self.layers[i] for i in scanned])} are "
                "non-finite after the update"
            )
        if grads:
            where.append(f"the gradient of {_names(grads)} is non-finite")
        if updates:
            where.append(f"the update of {_names(updates)} is non-finite")
        return Alert(
            kind="nonfinite",
            step=s.step,
            message=f"first non-finite value at step {s.step}: " + "; ".join(where),
            layers=layers,
            value=s.loss,
        )


def _bad(v: float | None) -> bool:
    return v is not None and not math.isfinite(v)


def _names(names: list[str], limit: int = 3) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")
