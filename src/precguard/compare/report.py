"""The comparison report: pydantic models written as JSON by ``compare --json``
(docs/compare.md, 'Reading the verdict', describes each field)."""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Generic, Literal, TextIO, TypeVar, get_args, overload

from pydantic import BaseModel, ConfigDict, Field, GetCoreSchemaHandler
from pydantic_core import CoreSchema, core_schema, from_json, to_json

from precguard.compare.advice import Advice
from precguard.compare.coverage import Coverage
from precguard.compare.impact_report import ErrorBudget, RemedyCheck
from precguard.compare.levels import METRICS_LEVELS, Metrics
from precguard.dump.schema import Phase, Role, Stats
from precguard.dump.shared_fields import share_fields_set
from precguard.errors import ExitCode
from precguard.numerics import SIGNIFICAND_BITS

COMPARISON_SCHEMA_VERSION = 1


_FROZEN = ConfigDict(frozen=True, ser_json_inf_nan="strings")

Status = Literal["pass", "fail", "missing", "nonfinite"]
Verdict = Literal["match", "diverged"]
T = TypeVar("T")


class RecordIdentity(BaseModel):
    """Which record a result is about: the fields of its key, and where it was captured.

    :class:`RecordResult`, :class:`FirstDivergence` and :class:`Suspect` extend it;
    in JSON its fields stay flat beside theirs.
    """

    model_config = _FROZEN

    key: str = Field(
        description="Record key, {module}.{call}.{phase}.{role}.{index} (the golden's; the "
        "actual's when golden has no counterpart)."
    )
    module: str = Field(description="Qualified module name ('root' for the root module).")
    module_type: str = Field(description="Module class name ('function' for functions).")
    call: int = Field(description="0-based call of the module within the step.")
    step: int = Field(description="Step.")
    rank: int = Field(description="Rank.")
    phase: Phase = Field(description="forward or backward.")
    role: Role = Field(description="input, output, param or grad (see docs/recording.md).")
    index: int = Field(description="Position among the tensors of that role.")

    def identity(self) -> RecordIdentity:
        """Just the identity fields, as a :class:`RecordIdentity`."""
        return RecordIdentity(**self.identity_fields())

    def identity_fields(self) -> dict[str, Any]:
        """The identity fields by name, to build another report model about the same record."""
        return {name: getattr(self, name) for name in RecordIdentity.model_fields}


class RecordResult(RecordIdentity):
    """One aligned pair (or an unmatched record) and its status."""

    actual_key: str | None = Field(
        default=None, description="Actual record key when it differs (aligned by order)."
    )
    golden_dtype: str = Field(
        description="dtype of the golden tensor (of the only side if unmatched)."
    )
    actual_dtype: str | None = Field(default=None, description="dtype of the actual tensor.")
    shape: list[int] = Field(description="Golden shape.")
    actual_shape: list[int] | None = Field(
        default=None, description="Actual shape, when it differs from the golden's."
    )
    seq: int = Field(description="Golden capture order (execution order).")
    status: Status = Field(description="pass, fail, missing (no counterpart) or nonfinite.")
    metrics: Metrics | None = Field(default=None, description="None when missing.")
    local: bool | None = Field(
        default=None,
        description="On failing produced records (forward outputs, backward gradients w.r.t. "
        "inputs and parameters) and parameters: True when the module made this error itself, "
        "False when it only passed it on; None elsewhere or when undecidable.",
    )
    amplification: float | None = Field(
        default=None,
        description="On failing produced records: measured error / expected error.",
    )
    expected_error: float | None = Field(
        default=None,
        description="On failing produced records and parameters: the error the module's "
        "precision explains given its inputs' error (compare with metrics.error).",
    )
    allowed_error: float | None = Field(
        default=None,
        description="The error the verdict held this record to (the expected error times "
        "the amplification, an optimizer step's allowance, or the profile's tolerance); "
        "None where no threshold applied (missing, exact, or a rule that judged it "
        "otherwise: a router's indices, a loss's precision).",
    )

    def model_post_init(self, context: Any, /) -> None:
        """Hold the shared set of given field names (a comparison holds a step's results at
        once: dump/shared_fields.py)."""
        share_fields_set(self)

    def model_copy(
        self, *, update: Mapping[str, Any] | None = None, deep: bool = False
    ) -> RecordResult:
        """pydantic's ``model_copy``; the copy holds the shared set of given field names."""
        copied = super().model_copy(update=update, deep=deep)
        share_fields_set(copied, nested=False)
        return copied


def _level_code(r: RecordResult) -> int:
    """The level ``r`` was compared at, as a byte; 0: a missing record (even with metrics);
    :data:`_SHAPE_CODE`: shapes differ and nothing was compared."""
    if r.metrics is None or r.status == "missing":
        return 0
    if r.actual_shape is not None and r.metrics.level == "none":
        return _SHAPE_CODE
    return _LEVEL_CODES[r.metrics.level]


class RecordRows(Sequence[RecordResult]):
    """Every record of a comparison, each kept as one compact row (about 0.2-0.5 KB).

    A RecordResult model costs about 3 KB; millions cannot be kept. A row is the
    JSON array of the result's ``model_dump(mode="json", exclude_defaults=True)``
    values, deflated against the words rows repeat (:data:`_ROW_WORDS`), rebuilt with
    ``model_validate`` when read. Field-name sets and metrics
    notes are kept once per store and numbered; a key spelled from its fields is
    rebuilt from them. Reading a row twice gives two equal, separate models; a row is
    replaced by assigning a result to its index.
    """

    __slots__ = ("_levels", "_names", "_notes", "_row_names", "_row_notes", "_rows", "_statuses")

    def __init__(self, results: Iterable[RecordResult] = ()) -> None:
        self._rows: list[bytes] = []
        #: one byte per row each, so counting and filtering read no row
        self._statuses = bytearray()
        self._levels = bytearray()
        #: per row, the number of its field names (result's, metrics') and of its note
        self._row_names = array("I")
        self._row_notes = array("I")
        self._names: _Numbered[tuple[tuple[str, ...], tuple[str, ...] | None]] = _Numbered()
        self._notes: _Numbered[str | None] = _Numbered()
        self.extend(results)

    def append(self, result: RecordResult) -> None:
        """Add ``result`` at the end."""
        self.extend((result,))

    def extend(self, results: Iterable[RecordResult]) -> None:
        """Add ``results`` at the end (another RecordRows' rows are shared, not re-encoded)."""
        if isinstance(results, RecordRows):
            self._rows.extend(results._rows)
            self._statuses += results._statuses
            self._levels += results._levels
            self._row_names.extend(self._names.renumber(results._names, results._row_names))
            self._row_notes.extend(self._notes.renumber(results._notes, results._row_notes))
            return
        for r in results:
            row, status, level, names, note = self._encode(r)
            self._rows.append(row)
            self._statuses.append(status)
            self._levels.append(level)
            self._row_names.append(names)
            self._row_notes.append(note)

    def __setitem__(self, i: int, result: RecordResult) -> None:
        """Put ``result`` in row ``i``'s place (compare's one pass writes each record settled
        where it was measured: compare/calls.py)."""
        i = range(len(self._rows))[i]  # IndexError and negatives as a list
        row, status, level, names, note = self._encode(result)
        self._rows[i] = row
        self._statuses[i] = status
        self._levels[i] = level
        self._row_names[i] = names
        self._row_notes[i] = note

    def _encode(self, r: RecordResult) -> tuple[bytes, int, int, int, int]:
        """Row of ``r``: its JSON, status and level codes, number of its field names, of its
        note."""
        fields = r.model_dump(
            mode="json",
            exclude={"key"} if r.key == _key_of(r.__dict__) else None,  # spelled from them
            exclude_defaults=True,
        )
        metrics = fields.pop("metrics", None)
        values = list(fields.values())
        if metrics is not None:
            metrics.pop("note", None)  # kept apart, numbered
            values.extend(metrics.values())
        return (
            _deflate(to_json(values)),
            _STATUS_CODES[r.status],
            _level_code(r),
            self._names.number((tuple(fields), None if metrics is None else tuple(metrics))),
            self._notes.number(None if r.metrics is None else r.metrics.note),
        )

    def _read(self, i: int) -> RecordResult:
        """The RecordResult of row ``i``."""
        names, metrics_names = self._names.values[self._row_names[i]]
        values = from_json(_inflate(self._rows[i]))
        fields = dict(zip(names, values, strict=False))
        if metrics_names is not None:
            metrics = dict(zip(metrics_names, values[len(names) :], strict=True))
            note = self._notes.values[self._row_notes[i]]
            if note is not None:
                metrics["note"] = note
            fields["metrics"] = metrics
        if "key" not in fields:
            fields["key"] = _key_of(fields)
        return RecordResult.model_validate(fields)

    def counts(self) -> Counts:
        """How many rows ended in each status, and at which level the pairs were compared."""
        return Counts.from_codes(self._statuses, self._levels)

    def having(self, statuses: Iterable[Status]) -> Iterator[RecordResult]:
        """The results whose status is one of ``statuses``, in order (no other row is read)."""
        for i in self.where(statuses):
            yield self._read(i)

    def where(self, statuses: Iterable[Status]) -> list[int]:
        """The positions of the rows whose status is one of ``statuses``, in order (no row
        is read)."""
        wanted = {_STATUS_CODES[s] for s in statuses}
        return [i for i, code in enumerate(self._statuses) if code in wanted]

    def __len__(self) -> int:
        return len(self._rows)

    @overload
    def __getitem__(self, index: int) -> RecordResult: ...

    @overload
    def __getitem__(self, index: slice) -> list[RecordResult]: ...

    def __getitem__(self, index: int | slice) -> RecordResult | list[RecordResult]:
        if isinstance(index, slice):
            return [self._read(i) for i in range(len(self._rows))[index]]
        return self._read(range(len(self._rows))[index])  # IndexError and negatives as a list

    def __iter__(self) -> Iterator[RecordResult]:
        for i in range(len(self._rows)):
            yield self._read(i)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, RecordRows):
            # the stored forms, not the models: NaN reads back unequal to itself
            return self._rows == other._rows and self._kept_apart() == other._kept_apart()
        if isinstance(other, Sequence) and not isinstance(other, str | bytes):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def _kept_apart(self) -> list[tuple[Any, str | None]]:
        """Per row, its field names and note (kept numbered, apart from the row)."""
        names, notes = self._names.values, self._notes.values
        return [(names[a], notes[b]) for a, b in zip(self._row_names, self._row_notes, strict=True)]

    def __repr__(self) -> str:
        return f"RecordRows({len(self)} records)"

    def nbytes(self) -> int:
        """Bytes the rows' deflated JSON and their numbers take (without the list and object
        headers; the names and notes kept once are a few kilobytes per store)."""
        numbers = self._row_names.itemsize * (len(self._row_names) + len(self._row_notes))
        return sum(map(len, self._rows)) + numbers

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        """Kept as is when given; a list of results becomes rows. JSON is written row by row."""
        item = handler.generate_schema(RecordResult)

        def serialize(value: Sequence[RecordResult], info: core_schema.SerializationInfo) -> Any:
            return iter(value) if info.mode_is_json() else list(value)

        # read lazily: each result is validated and turned into its row as the list is read
        rows = core_schema.no_info_after_validator_function(cls, core_schema.generator_schema(item))
        return core_schema.json_or_python_schema(
            json_schema=rows,
            python_schema=core_schema.no_info_wrap_validator_function(_keep_rows, rows),
            serialization=core_schema.plain_serializer_function_ser_schema(
                serialize, info_arg=True
            ),
        )


_STATUS_CODES: dict[Status, int] = {"pass": 1, "fail": 2, "missing": 3, "nonfinite": 4}
#: 0: no metrics (a missing record)
_LEVEL_CODES: dict[str, int] = {"full": 1, "stats": 2, "exact": 3, "none": 4}
#: a pair whose shapes differ, not compared (its own code, so the counts add up)
_SHAPE_CODE = 5


#: what a row is deflated against (zlib's preset dictionary): the words rows repeat (the
#: literal fields' values, the levels, float dtypes and statistics' names), so that a row
#: of a few hundred bytes of JSON is kept in about half
_ROW_WORDS = to_json(
    [
        *get_args(Phase),
        *get_args(Role),
        *get_args(Status),
        *METRICS_LEVELS,
        *SIGNIFICAND_BITS,
        dict.fromkeys(Stats.model_fields, 0.0),
    ]
)


def _deflate(row: bytes) -> bytes:
    """``row`` deflated (raw: no header or checksum) against :data:`_ROW_WORDS`."""
    deflate = zlib.compressobj(wbits=-zlib.MAX_WBITS, zdict=_ROW_WORDS)
    return deflate.compress(row) + deflate.flush()


def _inflate(row: bytes) -> bytes:
    """The row :func:`_deflate` deflated."""
    return zlib.decompressobj(wbits=-zlib.MAX_WBITS, zdict=_ROW_WORDS).decompress(row)


def _keep_rows(value: Any, validate: core_schema.ValidatorFunctionWrapHandler) -> Any:
    """Keep given rows as they are; validate anything else (a list of results) into rows."""
    return value if isinstance(value, RecordRows) else validate(value)


def _key_of(fields: dict[str, Any]) -> str:
    """The key a record of these fields has when it follows the usual spelling."""
    return (
        f"{fields['module']}.{fields['call']}.{fields['phase']}.{fields['role']}.{fields['index']}"
    )


class _Numbered(Generic[T]):
    """Distinct values, each kept once and known by its number (a store's own, not shared)."""

    __slots__ = ("_numbers", "values")

    def __init__(self) -> None:
        self.values: list[T] = []
        self._numbers: dict[T, int] = {}

    def number(self, value: T) -> int:
        """The number of ``value`` (added when new)."""
        number = self._numbers.get(value)
        if number is None:
            number = self._numbers[value] = len(self.values)
            self.values.append(value)
        return number

    def renumber(self, other: _Numbered[T], numbers: Iterable[int]) -> list[int]:
        """``numbers`` of ``other``'s values, as numbers of these."""
        mine = [self.number(value) for value in other.values]
        return [mine[n] for n in numbers]


class FirstDivergence(RecordIdentity):
    """Where the error was first introduced: the record that shows it (an output or a param)."""

    metrics: Metrics = Field(description="Metrics of that record.")
    local: bool | None = Field(
        description="True: this module made the error itself (inputs within tolerance, or "
        "output error >= the amplification threshold times the input error); False: it only "
        "passed error on; None: undecidable (backward, or inputs not recorded)."
    )
    amplification: float | None = Field(
        default=None, description="Output error / max(input error, unit roundoff)."
    )
    input_error: float | None = Field(default=None, description="Largest input error.")
    expected_error: float | None = Field(
        default=None,
        description="The output error the module's precision explains given its inputs: "
        "max(input error, rounding floor of the tolerance dtype); see docs/compare.md.",
    )
    confidence: Literal["full", "statistics"] = Field(
        default="full",
        description="'full': judged on full tensors; 'statistics': on recorded statistics "
        "only, a weaker test (equal statistics do not prove equal tensors, and a small scale "
        "error inside the tolerance of a statistic goes unseen).",
    )
    settle_with: str | None = Field(
        default=None,
        description="For a statistics-only verdict: the --tensors glob that records the "
        "module's full tensors (and its submodules') and settles it.",
    )
    reason: str = Field(description="One sentence saying why this module was named.")
    remedies: list[Advice] = Field(
        default_factory=list,
        description="Its candidate remedies, in the order --verify tries them, the smallest "
        "change first (compare/advice.py; empty: none to apply mechanically).",
    )
    remedy: RemedyCheck | None = Field(
        default=None,
        description="With --target --verify: the remedy verification chose (the first "
        "verified, else the partial one that left the least error; None: none helped).",
    )


class Suspect(RecordIdentity):
    """Another module call that made error on its own (its failing output or param record),
    ranked by amplification."""

    amplification: float | None = Field(description="Output / input error (None for params).")
    error: float = Field(description="Output error.")
    expected_error: float | None = Field(
        default=None, description="Output error its precision and inputs explain."
    )
    scale: float | None = Field(
        default=None, description="Least-squares scale of actual on golden (full tensors)."
    )
    confidence: Literal["full", "statistics"] = Field(
        default="full", description="'statistics' when judged on statistics only."
    )
    reason: str = Field(description="Why it is a suspect.")
    remedies: list[Advice] = Field(
        default_factory=list,
        description="Its candidate remedies, in the order --verify tries them.",
    )


class Unmatched(BaseModel):
    """Records with no counterpart on the other side."""

    model_config = _FROZEN

    golden_only: list[str] = Field(default_factory=list, description="Keys only in golden.")
    actual_only: list[str] = Field(default_factory=list, description="Keys only in actual.")


class Counts(BaseModel):
    """How many records ended in each status."""

    model_config = _FROZEN

    passed: int = Field(default=0, description="Records within tolerance.")
    failed: int = Field(default=0, description="Records outside tolerance.")
    nonfinite: int = Field(default=0, description="Records with NaN/Inf on one side only.")
    missing: int = Field(default=0, description="Records with no counterpart.")
    full: int = Field(default=0, description="Pairs compared on full tensors.")
    stats_only: int = Field(default=0, description="Pairs compared on statistics only.")
    shape_mismatch: int = Field(
        default=0,
        description="Pairs whose shapes differ and that were not compared (a pass when a "
        "router's explained re-routing accounts for it: an expert's token count). With "
        "full, stats_only and not_compared they add up to passed + failed + nonfinite.",
    )
    not_compared: int = Field(
        default=0, description="Other pairs with nothing comparable (no statistics recorded)."
    )

    @classmethod
    def of(cls, results: Sequence[RecordResult]) -> Counts:
        """The counts of ``results``: each under its status, and a compared (not
        ``missing``) pair also under its level (full or exact: ``full``; stats: ``stats_only``)."""
        if isinstance(results, RecordRows):
            return results.counts()  # from its status and level bytes, no row read
        statuses = bytearray(_STATUS_CODES[r.status] for r in results)
        return cls.from_codes(statuses, bytearray(_level_code(r) for r in results))

    @classmethod
    def from_codes(cls, statuses: bytearray, levels: bytearray) -> Counts:
        """The counts of records coded one byte each (``_STATUS_CODES``, :func:`_level_code`)."""
        status, level = statuses.count, levels.count
        return cls(
            passed=status(_STATUS_CODES["pass"]),
            failed=status(_STATUS_CODES["fail"]),
            nonfinite=status(_STATUS_CODES["nonfinite"]),
            missing=status(_STATUS_CODES["missing"]),
            full=level(_LEVEL_CODES["full"]) + level(_LEVEL_CODES["exact"]),
            stats_only=level(_LEVEL_CODES["stats"]),
            shape_mismatch=level(_SHAPE_CODE),
            not_compared=level(_LEVEL_CODES["none"]),
        )


class ReplayCheck(BaseModel):
    """A failing module re-run alone on the actual's device with the golden's inputs.

    The error compare *inferred* for the module (from its output and input
    errors in the two runs) beside the local error *measured* by the replay.
    """

    model_config = _FROZEN

    module: str = Field(description="Module name.")
    module_type: str = Field(description="Class name.")
    key: str = Field(description="Its failing record in the comparison.")
    step: int = Field(description="Step whose golden inputs were replayed.")
    rank: int = Field(description="Rank.")
    call: int = Field(description="Call of the module.")
    inferred_local: bool | None = Field(description="compare's local/propagated decision.")
    inferred_error: float = Field(description="The module's output error in the comparison.")
    amplification: float | None = Field(
        default=None, description="compare's output/input error ratio (None: weights differ)."
    )
    replayed: bool = Field(description="False when the replay could not run (see note).")
    device: str = Field(description="Device the module was replayed on (the actual's).")
    dtype: str | None = Field(default=None, description="dtype it was replayed in.")
    verdict: Verdict | None = Field(
        default=None,
        description="Replay verdict: 'diverged' means the module alone, fed the golden's "
        "inputs, is outside tolerance (its error is local); None when not replayed.",
    )
    local_error: float | None = Field(
        default=None, description="Measured local error (largest output relative L2)."
    )
    note: str = Field(default="", description="Why it was not replayed, or replay warnings.")


class Comparison(BaseModel):
    """The result of comparing an actual recording with a golden one."""

    model_config = _FROZEN

    schema_version: int = Field(
        default=COMPARISON_SCHEMA_VERSION, description="Version of this report format."
    )
    golden: str = Field(description="Golden recording directory.")
    actual: str = Field(description="Actual recording directory.")
    devices: list[str] = Field(
        default_factory=list, description="[golden device, actual device] from the manifests."
    )
    dtypes: list[str | None] = Field(
        default_factory=list, description="[golden model dtype, actual model dtype]."
    )
    compute_dtypes: list[str | None] = Field(
        default_factory=list,
        description="[golden, actual] precision the runs computed in when lower than their "
        "stored dtypes (an emu: profile's), from the manifests; None: as stored.",
    )
    tolerance_dtype: str = Field(
        default="auto",
        description="How each pair's tolerance dtype was chosen: 'auto' (the less precise "
        "side's compute precision), 'golden', or a dtype name.",
    )
    targets: list[str | None] = Field(
        default_factory=list,
        description="[golden target, actual target] as the manifests name them (never "
        "imported by compare; replay hints show them for the user to pass with --target).",
    )
    profile: str = Field(description="Tolerance profile used.")
    tolerances: dict[str, Any] = Field(description="The numbers the profile applied, per dtype.")
    verdict: Verdict = Field(
        description="'match' when every aligned record is within tolerance; otherwise "
        "'diverged'. Unmatched records are listed but do not change the verdict."
    )
    first_divergence: FirstDivergence | None = Field(
        description="The first module that introduced error, in execution order."
    )
    suspects: list[Suspect] = Field(
        default_factory=list,
        description="Other modules that introduced error, most amplifying first.",
    )
    further_findings: list[Suspect] = Field(
        default_factory=list,
        description="Every module call after a local first divergence that made error of "
        "its own, judged as the first was, in execution order and never capped (the calls "
        "suspects ranks); empty when the first divergence is not local.",
    )
    counts: Counts = Field(description="Records per status.")
    records: RecordRows = Field(
        description="Every record, in golden execution order (each read back as a RecordResult)."
    )
    unmatched: Unmatched = Field(description="Records on one side only.")
    fingerprint_diff: dict[str, list[Any]] = Field(
        default_factory=dict,
        description="Environment fingerprint keys whose values differ: key -> [golden, actual] "
        "(None where one side lacks the key).",
    )
    warnings: list[str] = Field(default_factory=list, description="Things the user should know.")
    replays: list[ReplayCheck] = Field(
        default_factory=list,
        description="With compare --replay: the failing modules re-run alone on the "
        "actual's device, inferred beside measured local error.",
    )
    impact: ErrorBudget | None = Field(
        default=None,
        description="With compare --target: the output error split over the local findings' "
        "modules, largest share first; with --verify each one's remedies (docs/impact.md).",
    )
    coverage: Coverage | None = Field(
        default=None,
        description="What was compared: steps, phases, whether both runs finished; "
        "'complete' false means the verdict covers only part of the recordings.",
    )

    @property
    def exit_code(self) -> int:
        """The CLI's exit code (:class:`~precguard.errors.ExitCode`): 1 diverged; 3 a match
        that covers only part of the recordings (``coverage.complete`` false: steps or phases
        one side lacks, a run that did not finish); 0 a match of everything."""
        if self.verdict != "match":
            return ExitCode.FAIL
        if self.coverage is not None and not self.coverage.complete:
            return ExitCode.INCONCLUSIVE
        return ExitCode.PASS


#: per indent: the empty records as dumped (a top-level key is the only place a raw
#: newline and this spelling can occur), then how written records open, part and close
_RECORDS_JSON = {
    None: ('"records":[],', '"records":[', ",", "],"),
    2: ('\n  "records": [],\n', '\n  "records": [\n    ', ",\n    ", "\n  ],\n"),
}


def write_comparison_json(result: Comparison, out: TextIO, *, indent: int | None = 2) -> None:
    """Write ``result.model_dump_json(indent=indent)`` to ``out`` a record at a time,
    without holding the whole (gigabytes for millions of records) in memory."""
    text = result.model_copy(update={"records": RecordRows()}).model_dump_json(indent=indent)
    marker, opening, between, closing = _RECORDS_JSON.get(indent, ("", "", "", ""))
    if not marker or text.count(marker) != 1 or not len(result.records):
        out.write(result.model_dump_json(indent=indent))  # another indent, or no records
        return
    head, tail = text.split(marker)
    out.write(head + opening)
    for i, r in enumerate(result.records):
        row = r.model_dump_json(indent=indent).replace("\n", "\n    ")
        out.write((between if i else "") + row)
    out.write(closing + tail)
