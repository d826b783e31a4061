"""What was measured for one pair of records: one model per level, told apart by ``level``.

:data:`Metrics` is the union of :class:`FullMetrics`, :class:`StatsMetrics`,
:class:`ExactMetrics` and :class:`UnmeasuredMetrics`, each generated from the one table
:data:`_FIELDS`: a field lives only on the levels that compute it. Each level still writes
every key of :data:`METRICS_JSON_FIELDS`, in order, null where it lacks one, and reading
refuses a value there (docs/compare.md, "One model per level").

>>> m = FullMetrics(level="full", dtype="bfloat16", error=3e-3, rel_l2=3e-3)
>>> isinstance(m, MeasuredMetrics), m.rel_l2
(True, 0.003)
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, Self

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    TypeAdapter,
    create_model,
    model_validator,
)
from pydantic_core import CoreSchema, core_schema

Level = Literal["full", "stats", "exact", "none"]

#: every key a metrics object writes after ``level``, ``dtype`` and ``error``, in the order
#: written: its type, default (``...``: required), the levels that have it (Full, Stats,
#: Exact, None) and its description.
# fmt: off
_FIELDS: dict[str, tuple[Any, Any, str, str]] = {
    "max_abs_err": (float | None, None, "F", "max |actual - golden|."),
    "mean_abs_err": (float | None, None, "F", "mean |actual - golden|."),
    "max_rel_err": (float | None, None, "F",
        "max |actual - golden| / max(|golden|, 1e-3 * rms(golden)); the floor keeps elements near "
        "zero from dominating."),
    "rmse": (float | None, None, "F", "Root mean square error."),
    "rel_l2": (float | None, None, "F", "||actual - golden||_2 / ||golden||_2 (normalized RMSE)."),
    "cosine": (float | None, None, "F", "Cosine similarity."),
    "max_ulp": (float | None, None, "F",
        "Largest distance in units in the last place of the actual dtype (golden rounded to that "
        "dtype first)."),
    "rel_err_share": (dict[str, float] | None, None, "F",
        "Share of elements whose guarded relative error exceeds each band ('1e-2' = 1%, '1e-3' = "
        "0.1%, '1e-4' = 0.01%)."),
    "close_share": (float | None, None, "F",
        "Share of elements outside |a-g| <= atol + rtol*|g| (assert_close's test) with atol "
        "raised to rtol * rms(golden) for tensors of small scale."),
    "nan_mismatch": (int, 0, "FSEN", "Elements NaN on exactly one side."),
    "inf_mismatch": (int, 0, "FSEN", "Elements ±Inf on one side but not equal."),
    "stat_rel_diff": (dict[str, float] | None, None, "S",
        "Per statistic: |a - g| / max(|g|, rms(golden)) (stats level only)."),
    "mismatched": (int, ..., "E", "Unequal elements."),
    "scale": (float | None, None, "FS",
        "Least-squares scale of actual on golden, <a,g>/<g,g> (full level): 1 within ~u/sqrt(n) "
        "under random rounding; 1.01 for an output scaled by 1%."),
    "scale_se": (float | None, None, "FS",
        "Standard error of scale, from 64 contiguous blocks of the tensor (cluster-robust: errors "
        "correlated within a row widen it)."),
    "mean_rel_err": (float | None, None, "F",
        "Mean signed relative error, mean((a-g)/g) with |g| floored at 1e-3 * rms(golden) (full "
        "level): s-1 for a scale fault, ~0 for random rounding."),
    "bias": (bool, False, "FSEN",
        "True when |scale - 1| is significant: beyond bias_z standard errors plus bias_floor_ulps "
        "unit roundoffs of the tolerance dtype (a systematic error)."),
    "peak_error": (float | None, None, "FS",
        "max |actual - golden| / max |golden| (full level): the largest element error against the "
        "element-wise bound one rounding gives (u * max|golden|)."),
    "slice_error": (float | None, None, "FS",
        "Relative L2 error of the worst slice along any dimension (one position, one channel, one "
        "head), each slice's golden norm floored at the typical slice's, rms(golden) per element "
        "(full level): an error confined to a few slices shows here; a slice of small values is "
        "judged by its share of the tensor's error."),
    "slice_dim": (int | None, None, "FS", "Dimension of the worst slice."),
    "slice_index": (int | None, None, "FS", "Index of the worst slice along slice_dim."),
    "sample_size": (int | None, None, "S",
        "Sampled elements compared (stats level, both records keep the same sample): the error is "
        "then estimated from them."),
    "sample_rel_l2": (float | None, None, "S",
        "rms(actual - golden) over the sampled elements / rms(golden) over the whole tensor: an "
        "estimate of rel_l2 (stats level)."),
    "sample_max_abs": (float | None, None, "S", "max |actual - golden| over the sampled elements."),
    "sample_rse": (float | None, None, "S",
        "Relative standard error of the sampled mean squared error, from the sample's own spread "
        "of squared errors (finite-population corrected: 0 when every element was sampled); the "
        "judge holds sample_rel_l2 to the bounds it gives (docs/compare.md, 'Sampling "
        "uncertainty')."),
    "sample_peaks": (list[float] | None, None, "S",
        "The largest sampled element errors over the sample's largest golden value, in decreasing "
        "order (up to 16): how many sampled elements carry the peak error."),
    "pos_dim": (int | None, None, "S", "Sequence dimension of the per-position norms compared."),
    "pos_bin": (int | None, None, "S", "Consecutive positions per compared norm (1 up to 256)."),
    "pos_worst": (int | None, None, "S",
        "First position of the bin whose norm differs most (relatively): where an error "
        "concentrated along the sequence sits."),
    "pos_worst_err": (float | None, None, "S",
        "|norm(actual) - norm(golden)| / norm(golden) at pos_worst (its norm floored at the "
        "positions' rms, SLICE_FLOOR)."),
    "pos_rel_l2": (float | None, None, "S",
        "||norms(actual) - norms(golden)|| / ||norms(golden)|| over the positions: a lower bound "
        "on the tensor's rel_l2 (triangle inequality per position)."),
    "note": (str | None, None, "FSEN", "Why the level is weaker, if it is."),
    "rerouted": (int | None, None, "FSEN",
        "Mixture of experts (docs/compare.md): on a router's top-k indices and the records that "
        "follow its routing, the tokens whose choice of experts differs between the runs (None: "
        "no routing involved; -1: not known from statistics)."),
    "reroute_margin": (float | None, None, "FSEN",
        "On a router's indices: the largest golden score margin a re-routed token crossed (the "
        "k-th against the (k+1)-th score, or the two it swapped)."),
    "reroute_tolerance": (float | None, None, "FSEN",
        "On a router's indices: the margin its scores' expected error lets rounding cross, 2 * "
        "amplification * expected error * max|golden score|."),
    "routed_rows": (int | None, None, "FSEN",
        "On records that follow a routing, compared on full tensors: the rows (tokens, or "
        "token-expert pairs) both runs routed alike, on which the metrics were measured."),
    "error_all_rows": (float | None, None, "FSEN",
        "On records compared on the rows routed alike: the error over every row, re-routed ones "
        "included; what the record passes on to what consumes it."),
    "conc_all_rows": (float | None, None, "FSEN",
        "The concentrated error (worst slice, max-abs) over every row, likewise."),
}
# fmt: on

#: every key a metrics object writes in JSON, in the order written
METRICS_JSON_FIELDS: tuple[str, ...] = ("level", "dtype", "error", *_FIELDS)

#: every key null: a level's fields are laid over it to write every key in order
_NULLS: dict[str, None] = dict.fromkeys(METRICS_JSON_FIELDS)


def _written_as_every_key(
    cls: type[BaseModel], schema: core_schema.ModelSchema, fields: Mapping[str, Any]
) -> core_schema.SerSchema:
    """How the level ``cls`` is written: every key of :data:`METRICS_JSON_FIELDS` in order,
    null where the level lacks it (``schema`` is its model's core schema, ``fields`` its
    fields'): pydantic's serializer of a dict with every key, fed by :func:`_every_key`
    (docs/compare.md, 'One model per level')."""
    lacked = core_schema.typed_dict_field(
        core_schema.with_default_schema(core_schema.none_schema(), default=None),
        required=False,
        metadata={"pydantic_js_updates": {"description": "Not measured at this level."}},
    )
    every_key = core_schema.typed_dict_schema(
        {
            name: core_schema.typed_dict_field(
                fields[name]["schema"], required=False, metadata=fields[name].get("metadata")
            )
            if name in fields
            else lacked
            for name in METRICS_JSON_FIELDS
        },
    )
    merged = core_schema.plain_serializer_function_ser_schema(
        _every_key, info_arg=True, return_schema=every_key
    )
    ser = core_schema.model_ser_schema(cls, core_schema.any_schema(serialization=merged))
    # the model's config (NaN and Infinity written as strings): a model's serializer reads it
    ser["config"] = schema.get("config")  # type: ignore[typeddict-unknown-key]
    return ser


def _every_key(fields: dict[str, Any], info: core_schema.SerializationInfo) -> dict[str, Any]:
    """A level's fields (its model's ``__dict__``) laid over a null for every key, with
    ``include`` and ``exclude`` applied key by key (pydantic hands them to a plain
    serializer, not to its return schema); a filter inside one key is refused."""
    # left out as defaults or as None, the nulls need not be laid down (a compact row)
    merged = fields if info.exclude_defaults or info.exclude_none else _NULLS | fields
    if info.include is None and info.exclude is None:
        return merged
    return {
        k: v
        for k, v in merged.items()
        if _picked(info.include, k, default=True) and not _picked(info.exclude, k, default=False)
    }


def _picked(spec: Any, key: str, *, default: bool) -> bool:
    """Whether an ``include``/``exclude`` spec (a set of keys, or a dict of key to True)
    names ``key`` whole; ``default`` when there is no spec."""
    if spec is None:
        return default
    if isinstance(spec, dict):
        value = spec.get(key, spec.get("__all__", False))
        if value not in (True, False, ...):
            raise ValueError(
                f"metrics {key!r}: a key of a metrics object is included or excluded whole "
                f"(got {value!r})"
            )
        return value is not False
    return key in spec


class MetricsBase(BaseModel):
    """What every level of :data:`Metrics` has: the level, the tolerance dtype, the error the
    judge reads, non-finite mismatches, the note, ``bias`` and the routing fields. Only
    ``level``, ``dtype`` and ``error`` are declared (written first); the others are
    generated on each level from :data:`_FIELDS` and typed here for readers."""

    model_config = ConfigDict(
        frozen=True, ser_json_inf_nan="strings", serialize_by_alias=True, validate_by_alias=True
    )

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

    if TYPE_CHECKING:
        nan_mismatch: int
        inf_mismatch: int
        bias: bool
        note: str | None
        rerouted: int | None
        reroute_margin: float | None
        reroute_tolerance: float | None
        routed_rows: int | None
        error_all_rows: float | None
        conc_all_rows: float | None

    #: this level's fields (the keys of :data:`METRICS_JSON_FIELDS` it measures)
    _own: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls._own = frozenset(cls.model_fields)

    @classmethod
    def __get_pydantic_core_schema__(
        cls, source: type[BaseModel], handler: GetCoreSchemaHandler
    ) -> CoreSchema:
        """Pydantic's schema of the level, written as every key of the JSON (see the module
        docstring): validation is the model's own."""
        schema = handler(source)
        if schema["type"] == "model":
            fields = schema["schema"]
            while fields["type"] != "model-fields":  # under the model validator
                fields = fields["schema"]  # type: ignore[typeddict-item]
            schema["serialization"] = _written_as_every_key(cls, schema, fields["fields"])
        return schema

    @model_validator(mode="before")
    @classmethod
    def _nothing_on_keys_the_level_lacks(cls, data: Any) -> Any:
        """A null on a key the level lacks is what the JSON has there (accepted, then left
        out: the model has no such field); a value is an error, never silently dropped."""
        if isinstance(data, dict) and not data.keys() <= cls._own:
            _refuse_values(
                str(data.get("level", cls.__name__)), data, (data.keys() - cls._own) & _NULLS.keys()
            )
        return data

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        """A copy with ``update`` applied. A key this level lacks must be None (dropped: it
        is null already); the level cannot change (:func:`metrics_with` builds another
        level's metrics)."""
        if update and update.get("level", self.level) != self.level:
            raise ValueError(
                f"{self.level} metrics cannot become {update['level']} by model_copy; "
                "metrics_with builds that level's metrics"
            )
        if update and not update.keys() <= self._own:
            _refuse_values(self.level, update, update.keys() - self._own)
            update = {k: v for k, v in update.items() if k in self._own}
        return super().model_copy(update=update, deep=deep)


class MeasuredMetrics(MetricsBase):
    """What both float levels (``full`` and ``stats``) measure: the least-squares scale and
    the concentrated error (the worst slice, the largest element's)."""

    if TYPE_CHECKING:
        scale: float | None
        scale_se: float | None
        peak_error: float | None
        slice_error: float | None
        slice_dim: int | None
        slice_index: int | None


def _level(
    name: str, base: type[MetricsBase], level: str, level_doc: str, doc: str
) -> type[MetricsBase]:
    """The model of one level: ``level`` and the fields of :data:`_FIELDS` it has, in order."""
    code = level[0].upper()  # F, S, E, N
    fields: dict[str, Any] = {
        key: (kind, Field(default, description=text))
        for key, (kind, default, levels, text) in _FIELDS.items()
        if code in levels
    }
    return create_model(
        name,
        __base__=base,
        __doc__=doc,
        __module__=__name__,
        level=(Literal[level], Field(description=level_doc)),
        **fields,
    )


FullMetrics = _level(
    "FullMetrics",
    MeasuredMetrics,
    "full",
    "'full': both full tensors were compared.",
    "Both full tensors compared: error norms, cosine, ULPs, the scale, the worst slice.",
)
StatsMetrics = _level(
    "StatsMetrics",
    MeasuredMetrics,
    "stats",
    "'stats': only the recorded statistics (a weaker test: equal statistics do not prove "
    "equal tensors).",
    "Only the recorded statistics (and the sampled elements and per-position norms they\n"
    "    keep) compared: a weaker test, equal statistics do not prove equal tensors.",
)
ExactMetrics = _level(
    "ExactMetrics",
    MetricsBase,
    "exact",
    "'exact': integer/bool tensors compared for equality.",
    "Integer or boolean tensors compared element by element for equality.",
)
UnmeasuredMetrics = _level(
    "UnmeasuredMetrics",
    MetricsBase,
    "none",
    "'none': nothing comparable.",
    "Nothing comparable (shapes differ, no statistics recorded): the note says why.",
)


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
_ADAPTER: TypeAdapter[Metrics] = TypeAdapter(Metrics)


def _refuse_values(level: str, values: Mapping[str, Any], lacked: Iterable[str]) -> None:
    """ValueError when ``values`` has a value (not None) on a key ``level`` lacks."""
    for name in lacked:
        if values[name] is not None:
            measured = [at for at, cls in METRICS_LEVELS.items() if name in cls._own]
            raise ValueError(
                f"{level} metrics have no {name} (got {values[name]!r}); it is measured at "
                f"level {' or '.join(measured) or 'none'}"
            )


def concentrated(m: MetricsBase) -> tuple[float | None, float | None]:
    """``(slice_error, peak_error)``: the concentrated error a level measured (the worst
    slice's, the largest element's), ``(None, None)`` where it measures none (exact, none)."""
    if isinstance(m, MeasuredMetrics):
        return m.slice_error, m.peak_error
    return None, None


def metrics_of(fields: Mapping[str, Any]) -> Metrics:
    """The metrics model of ``fields["level"]``, as read from JSON (nulls on keys the
    level lacks accepted, a value on one refused).

    >>> metrics_of({"level": "exact", "dtype": "int64", "error": 0.0, "mismatched": 0}).level
    'exact'
    """
    return _ADAPTER.validate_python(fields)


def metrics_with(m: MetricsBase, update: Mapping[str, Any]) -> Metrics:
    """``m`` with ``update`` applied, as the model of the level it ends at (``update``
    may change ``level``): ``m``'s fields that level lacks are left behind; ``update``'s
    must be None or absent."""
    level = update.get("level", m.level)
    own = METRICS_LEVELS[level]._own if level in METRICS_LEVELS else frozenset()
    # what ``m`` measured at its own level and the new one lacks is left behind
    kept = {name: getattr(m, name) for name in m.model_fields_set if name in own}
    return metrics_of({**kept, "level": m.level, **update})
