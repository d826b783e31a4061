"""What was measured for one pair of records: one model per level, told apart by ``level``.

A pair is compared at one of four levels, and each level measures different things:
``full`` (both full tensors: error norms, cosine, ULPs, the scale and the worst slice),
``stats`` (the recorded statistics, the sampled elements and the per-position norms),
``exact`` (integer or boolean tensors compared for equality) and ``none`` (nothing
comparable: a shape mismatch, no statistics). :data:`Metrics` is the union of
:class:`FullMetrics`, :class:`StatsMetrics`, :class:`ExactMetrics` and
:class:`UnmeasuredMetrics`, discriminated by ``level``: a field lives on the levels that
compute it, so reading ``sample_rse`` off full metrics is an AttributeError (and a type
error) rather than a silent None. What every level has (and what the rules after the
measurement set on any level: ``bias`` from tolerance.py, the routing fields from
routing.py) is on :class:`MetricsBase`; the scale and the concentrated error, which both
float levels measure, on :class:`MeasuredMetrics`.

The JSON is the same as when one model held every field: each level writes every key of
:data:`METRICS_JSON_FIELDS`, in that order, with null for a key its level lacks, so a
reader of older reports (or of this one, without the union) sees the same keys. Reading
accepts those nulls and drops them; a value that is not null on a key the level lacks is
an error (``stats`` metrics with a ``cosine``), as is a ``model_copy`` that sets one.

>>> m = FullMetrics(dtype="bfloat16", error=3e-3, rel_l2=3e-3, cosine=0.99999)
>>> isinstance(m, MeasuredMetrics), m.level
(True, 'full')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializationInfo,
    SerializerFunctionWrapHandler,
    TypeAdapter,
    model_serializer,
    model_validator,
)

Level = Literal["full", "stats", "exact", "none"]

#: every key a metrics object writes in JSON, in the order written (the order of the one
#: model that held them all before the levels were told apart: byte-identical reports)
METRICS_JSON_FIELDS: tuple[str, ...] = (
    "level",
    "dtype",
    "error",
    "max_abs_err",
    "mean_abs_err",
    "max_rel_err",
    "rmse",
    "rel_l2",
    "cosine",
    "max_ulp",
    "rel_err_share",
    "close_share",
    "nan_mismatch",
    "inf_mismatch",
    "stat_rel_diff",
    "mismatched",
    "scale",
    "scale_se",
    "mean_rel_err",
    "bias",
    "peak_error",
    "slice_error",
    "slice_dim",
    "slice_index",
    "sample_size",
    "sample_rel_l2",
    "sample_max_abs",
    "sample_rse",
    "sample_peaks",
    "pos_dim",
    "pos_bin",
    "pos_worst",
    "pos_worst_err",
    "pos_rel_l2",
    "note",
    "rerouted",
    "reroute_margin",
    "reroute_tolerance",
    "routed_rows",
    "error_all_rows",
    "conc_all_rows",
)


class MetricsBase(BaseModel):
    """What every level of :data:`Metrics` has: the level, the tolerance dtype, the error the
    judge reads, non-finite mismatches, the note, and what the rules after the measurement
    set on any level (``bias``: tolerance.py; the routing fields: routing.py)."""

    model_config = ConfigDict(frozen=True, ser_json_inf_nan="strings")

    level: Level = Field(
        description="'full': both full tensors were compared; 'stats': only the recorded "
        "statistics (a weaker test: equal statistics do not prove equal tensors); "
        "'exact': integer/bool tensors compared for equality; 'none': nothing comparable."
    )
    dtype: str = Field(description="dtype the tolerance was taken from (the less precise side).")
    error: float = Field(
        description="The scalar error used for local-vs-propagated decisions: relative L2 "
        "error (full); at the stats level the rel_l2 estimated from the sampled elements, "
        "raised to the lower bounds the norms give (per position and overall), or the largest "
        "statistic difference when no sample was kept; share of unequal elements (exact)."
    )
    nan_mismatch: int = Field(default=0, description="Elements NaN on exactly one side.")
    inf_mismatch: int = Field(default=0, description="Elements ±Inf on one side but not equal.")
    bias: bool = Field(
        default=False,
        description="True when |scale - 1| is significant: beyond bias_z standard errors "
        "plus bias_floor_ulps unit roundoffs of the tolerance dtype (a systematic error).",
    )
    note: str | None = Field(default=None, description="Why the level is weaker, if it is.")
    rerouted: int | None = Field(
        default=None,
        description="Mixture of experts (docs/compare.md): on a router's top-k indices and "
        "the records that follow its routing, the tokens whose choice of experts differs "
        "between the runs (None: no routing involved; -1: not known from statistics).",
    )
    reroute_margin: float | None = Field(
        default=None,
        description="On a router's indices: the largest golden score margin a re-routed token "
        "crossed (the k-th against the (k+1)-th score, or the two it swapped).",
    )
    reroute_tolerance: float | None = Field(
        default=None,
        description="On a router's indices: the margin its scores' expected error lets rounding "
        "cross, 2 * amplification * expected error * max|golden score|.",
    )
    routed_rows: int | None = Field(
        default=None,
        description="On records that follow a routing, compared on full tensors: the rows "
        "(tokens, or token-expert pairs) both runs routed alike, on which the metrics were "
        "measured.",
    )
    error_all_rows: float | None = Field(
        default=None,
        description="On records compared on the rows routed alike: the error over every row, "
        "re-routed ones included; what the record passes on to what consumes it.",
    )
    conc_all_rows: float | None = Field(
        default=None,
        description="The concentrated error (worst slice, max-abs) over every row, likewise.",
    )

    #: this level's field names, and its share of :data:`METRICS_JSON_FIELDS` in that order
    #: (set on each level's class: read on every validation and dump, a hot path)
    _own: ClassVar[frozenset[str]] = frozenset()
    _own_order: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._own = frozenset(cls.model_fields)
        cls._own_order = tuple(name for name in METRICS_JSON_FIELDS if name in cls._own)

    @model_validator(mode="before")
    @classmethod
    def _no_foreign_values(cls, data: Any) -> Any:
        """Accept the nulls the JSON writes for keys this level lacks (extra keys are
        ignored); refuse a value on a key another level has: it would be lost."""
        if type(data) is dict and not data.keys() <= cls._own:
            _check_foreign(cls, data)
        return data

    @model_serializer(mode="wrap")
    def _every_key(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> Any:
        """Every key of :data:`METRICS_JSON_FIELDS` in its order, null where this level
        lacks it. When Nones or unset fields are left out, what pydantic gives, in that
        order; when defaults are (compare's rows and a worker's share, which name every
        value's key), in pydantic's order. The level is always kept: reading it back is
        told apart by it."""
        fields = handler(self)
        if info.exclude_defaults or info.exclude_none or info.exclude_unset:
            fields.setdefault("level", self.level)
            if info.exclude_defaults:
                return fields
            return {name: fields[name] for name in self._own_order if name in fields}
        if len(fields) == len(self._own):  # nothing left out (include/exclude): the fast way
            out = dict.fromkeys(METRICS_JSON_FIELDS)
            out.update(fields)
            return out
        own = self._own
        return {
            name: fields[name] if name in own else None
            for name in METRICS_JSON_FIELDS
            if name in fields or name not in own
        }

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied; a key this level lacks must be None (dropped), and
        the level cannot change (:func:`metrics_with` builds another level's metrics)."""
        if update:
            if update.get("level", self.level) != self.level:
                raise ValueError(
                    f"{self.level} metrics cannot become {update['level']} by model_copy; "
                    "metrics_with builds that level's metrics"
                )
            if not update.keys() <= self._own:
                _check_foreign(type(self), update)
                update = {k: v for k, v in update.items() if k in self._own}
        return super().model_copy(update=update, deep=deep)


def _check_foreign(cls: type[MetricsBase], fields: Mapping[str, Any]) -> None:
    """Raise when ``fields`` holds a value on a metrics key ``cls``'s level lacks."""
    own = cls.model_fields
    for name, value in fields.items():
        if value is not None and name not in own and name in _ALL_FIELDS:
            level = cls.model_fields["level"].default
            raise ValueError(
                f"{level} metrics have no {name} (got {value!r}): it is measured at "
                f"level {' or '.join(_LEVELS_OF[name])}"
            )


class MeasuredMetrics(MetricsBase):
    """What both float levels (``full`` and ``stats``) measure: the least-squares scale and
    the concentrated error (the worst slice, the largest element's)."""

    scale: float | None = Field(
        default=None,
        description="Least-squares scale of actual on golden, <a,g>/<g,g> (full level): 1 "
        "within ~u/sqrt(n) under random rounding; 1.01 for an output scaled by 1%.",
    )
    scale_se: float | None = Field(
        default=None,
        description="Standard error of scale, from 64 contiguous blocks of the tensor "
        "(cluster-robust: errors correlated within a row widen it).",
    )
    peak_error: float | None = Field(
        default=None,
        description="max |actual - golden| / max |golden| (full level): the largest element "
        "error against the element-wise bound one rounding gives (u * max|golden|).",
    )
    slice_error: float | None = Field(
        default=None,
        description="Relative L2 error of the worst slice along any dimension (one position, "
        "one channel, one head), each slice's golden norm floored at the typical slice's, "
        "rms(golden) per element (full level): an error confined to a few slices shows "
        "here; a slice of small values is judged by its share of the tensor's error.",
    )
    slice_dim: int | None = Field(default=None, description="Dimension of the worst slice.")
    slice_index: int | None = Field(
        default=None, description="Index of the worst slice along slice_dim."
    )


class FullMetrics(MeasuredMetrics):
    """Both full tensors compared: error norms, cosine, ULPs, the scale, the worst slice."""

    level: Literal["full"] = Field(
        default="full", description="'full': both full tensors were compared."
    )
    max_abs_err: float | None = Field(default=None, description="max |actual - golden|.")
    mean_abs_err: float | None = Field(default=None, description="mean |actual - golden|.")
    max_rel_err: float | None = Field(
        default=None,
        description="max |actual - golden| / max(|golden|, 1e-3 * rms(golden)); the floor "
        "keeps elements near zero from dominating.",
    )
    rmse: float | None = Field(default=None, description="Root mean square error.")
    rel_l2: float | None = Field(
        default=None, description="||actual - golden||_2 / ||golden||_2 (normalized RMSE)."
    )
    cosine: float | None = Field(default=None, description="Cosine similarity.")
    max_ulp: float | None = Field(
        default=None,
        description="Largest distance in units in the last place of the actual dtype "
        "(golden rounded to that dtype first).",
    )
    rel_err_share: dict[str, float] | None = Field(
        default=None,
        description="Share of elements whose guarded relative error exceeds each band "
        "('1e-2' = 1%, '1e-3' = 0.1%, '1e-4' = 0.01%).",
    )
    close_share: float | None = Field(
        default=None,
        description="Share of elements outside |a-g| <= atol + rtol*|g| (assert_close's test) "
        "with atol raised to rtol * rms(golden) for tensors of small scale.",
    )
    mean_rel_err: float | None = Field(
        default=None,
        description="Mean signed relative error, mean((a-g)/g) with |g| floored at 1e-3 * "
        "rms(golden) (full level): s-1 for a scale fault, ~0 for random rounding.",
    )


class StatsMetrics(MeasuredMetrics):
    """Only the recorded statistics (and the sampled elements and per-position norms they
    keep) compared: a weaker test, equal statistics do not prove equal tensors."""

    level: Literal["stats"] = Field(
        default="stats",
        description="'stats': only the recorded statistics (a weaker test: equal statistics "
        "do not prove equal tensors).",
    )
    stat_rel_diff: dict[str, float] | None = Field(
        default=None,
        description="Per statistic: |a - g| / max(|g|, rms(golden)) (stats level only).",
    )
    sample_size: int | None = Field(
        default=None,
        description="Sampled elements compared (stats level, both records keep the same "
        "sample): the error is then estimated from them.",
    )
    sample_rel_l2: float | None = Field(
        default=None,
        description="rms(actual - golden) over the sampled elements / rms(golden) over the "
        "whole tensor: an estimate of rel_l2 (stats level).",
    )
    sample_max_abs: float | None = Field(
        default=None, description="max |actual - golden| over the sampled elements."
    )
    sample_rse: float | None = Field(
        default=None,
        description="Relative standard error of the sampled mean squared error, from the "
        "sample's own spread of squared errors (finite-population corrected: 0 when every "
        "element was sampled); the judge holds sample_rel_l2 to the bounds it gives "
        "(docs/compare.md, 'Sampling uncertainty').",
    )
    sample_peaks: list[float] | None = Field(
        default=None,
        description="The largest sampled element errors over the sample's largest golden "
        "value, in decreasing order (up to 16): how many sampled elements carry the peak "
        "error.",
    )
    pos_dim: int | None = Field(
        default=None, description="Sequence dimension of the per-position norms compared."
    )
    pos_bin: int | None = Field(
        default=None, description="Consecutive positions per compared norm (1 up to 256)."
    )
    pos_worst: int | None = Field(
        default=None,
        description="First position of the bin whose norm differs most (relatively): where "
        "an error concentrated along the sequence sits.",
    )
    pos_worst_err: float | None = Field(
        default=None,
        description="|norm(actual) - norm(golden)| / norm(golden) at pos_worst (its norm "
        "floored at the positions' rms, SLICE_FLOOR).",
    )
    pos_rel_l2: float | None = Field(
        default=None,
        description="||norms(actual) - norms(golden)|| / ||norms(golden)|| over the positions: "
        "a lower bound on the tensor's rel_l2 (triangle inequality per position).",
    )


class ExactMetrics(MetricsBase):
    """Integer or boolean tensors compared element by element for equality."""

    level: Literal["exact"] = Field(
        default="exact", description="'exact': integer/bool tensors compared for equality."
    )
    mismatched: int = Field(description="Unequal elements.")


class UnmeasuredMetrics(MetricsBase):
    """Nothing comparable (shapes differ, no statistics recorded): the note says why."""

    level: Literal["none"] = Field(default="none", description="'none': nothing comparable.")


#: what one pair's comparison measured: the model of its level (discriminated by ``level``)
Metrics = Annotated[
    FullMetrics | StatsMetrics | ExactMetrics | UnmeasuredMetrics, Field(discriminator="level")
]
METRICS_LEVELS: dict[str, type[MetricsBase]] = {
    "full": FullMetrics,
    "stats": StatsMetrics,
    "exact": ExactMetrics,
    "none": UnmeasuredMetrics,
}
_ALL_FIELDS = frozenset(METRICS_JSON_FIELDS)
_LEVELS_OF: dict[str, list[str]] = {
    name: [lvl for lvl, cls in METRICS_LEVELS.items() if name in cls.model_fields]
    for name in METRICS_JSON_FIELDS
}
assert set(METRICS_JSON_FIELDS) == set().union(*(c.model_fields for c in METRICS_LEVELS.values()))
_ADAPTER: TypeAdapter[Metrics] = TypeAdapter(Metrics)


def concentrated(m: MetricsBase) -> tuple[float | None, float | None]:
    """``(slice_error, peak_error)``: the concentrated error a level measured (the worst
    slice's, the largest element's), ``(None, None)`` where it measures none (exact, none)."""
    if isinstance(m, MeasuredMetrics):
        return m.slice_error, m.peak_error
    return None, None


def metrics_of(fields: Mapping[str, Any]) -> Metrics:
    """The metrics model of ``fields["level"]`` (as read from JSON: nulls on keys the
    level lacks are dropped, a value on one is an error)."""
    return _ADAPTER.validate_python(fields)


def metrics_with(m: MetricsBase, update: Mapping[str, Any]) -> Metrics:
    """``m`` with ``update`` applied, as the model of the level it ends at (``update``
    may change ``level``): ``m``'s fields that level lacks are left behind; ``update``'s
    must be None or absent."""
    level = update.get("level", m.level)
    own = METRICS_LEVELS[level].model_fields if level in METRICS_LEVELS else {}
    # what ``m`` measured at its own level and the new one lacks is left behind
    kept = {name: getattr(m, name) for name in m.model_fields_set if name in own}
    return metrics_of({**kept, "level": m.level, **update})


__all__ = [
    "METRICS_JSON_FIELDS",
    "METRICS_LEVELS",
    "ExactMetrics",
    "FullMetrics",
    "Level",
    "MeasuredMetrics",
    "Metrics",
    "MetricsBase",
    "StatsMetrics",
    "UnmeasuredMetrics",
    "concentrated",
    "metrics_of",
    "metrics_with",
]
