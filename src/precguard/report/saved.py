"""Read back a saved result (``compare --json``, ``check --json``) to render it again.

The file may have travelled (an attachment, a ticket): it is read as
untrusted input, size-bounded, and validated by the same pydantic models that
wrote it. Which kind it is, is told by its fields: a comparison has
``records`` and ``golden``; a diagnosis has ``checklist`` and ``findings``.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from precguard.compare.report import Comparison
    from precguard.report.models import Diagnosis

#: largest result file read (a comparison of a large model holds many records)
MAX_RESULT_BYTES = 1 << 30


def load_result(path: Path) -> Comparison | Diagnosis:
    """The :class:`Comparison` or :class:`Diagnosis` saved in ``path``.

    :raises UsageError: the file cannot be read, is not JSON, or is neither.
    """
    from pydantic import ValidationError

    from precguard.compare.report import Comparison
    from precguard.dump.untrusted import first_error, read_json_file
    from precguard.errors import DumpFormatError, UsageError
    from precguard.report.models import Diagnosis
    from precguard.text import shown

    try:
        raw = read_json_file(path, limit=MAX_RESULT_BYTES, what="precguard result")
    except DumpFormatError as exc:
        raise UsageError(str(exc)) from exc
    if not isinstance(raw, dict):
        raise UsageError(f"{shown(path)}: expected a JSON object (compare --json or check --json)")
    if "records" in raw and "golden" in raw:
        model: type[Comparison] | type[Diagnosis] = Comparison
        what = "comparison"
    elif "findings" in raw and "checklist" in raw:
        model, what = Diagnosis, "diagnosis"
    else:
        raise UsageError(
            f"{shown(path)}: neither a comparison (compare --json) nor a diagnosis "
            "(check --json): it has no 'records' nor 'findings'"
        )
    _check_version(raw, path, model, what)
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        raise UsageError(f"{shown(path)}: not a valid {what}: {first_error(exc)}") from exc


def _check_version(raw: dict, path: Path, model: type, what: str) -> None:
    """Refuse a result of a format version this precguard does not know.

    A newer version may mean fields this one would misread; an older file
    without the field is version 1.
    """
    from precguard.errors import UsageError
    from precguard.text import shown

    known = model.model_fields["schema_version"].default
    version = raw.get("schema_version", 1)
    if type(version) is not int or not 1 <= version <= known:
        raise UsageError(
            f"{shown(path)}: a {what} of schema_version {shown(repr(version), 20)}; this "
            f"precguard reads versions 1 to {known} (a newer precguard wrote it?)"
        )
