"""One set of given field names per distinct set, shared by the instances kept in bulk.

A pydantic model keeps, beside its fields, the set of the names of the fields
it was given (``model_fields_set``): for a record of a dozen fields a hash
table of about 0.7 KB per instance, a quarter of a record's memory and more
than its values. A comparison holds a whole step's records and results at once
(millions in a big step), and almost all of them were given the same few sets
of names; :func:`share_fields_set` makes an instance use one set kept once per
distinct set of names instead (a few per run).

Only frozen models share: their fields (and so their set) never change in
place. pydantic's ``model_copy`` copies the set before it updates it, and a
shared set's copy is a plain set of the copy's own, so an update never reaches
the other instances; their values, equality, and JSON are unchanged.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

__all__ = ["SharedFieldsSet", "share_fields_set"]


class SharedFieldsSet(set[str]):
    """A set of field names that many frozen model instances hold: never changed in place;
    a copy is a plain ``set`` of its own."""

    __slots__ = ()

    def __copy__(self) -> set[str]:
        return set(self)

    def __deepcopy__(self, memo: dict[int, Any]) -> set[str]:
        return set(self)


#: whether a model class is frozen, by class
_FROZEN: dict[type[BaseModel], bool] = {}
#: each distinct set of names, kept once (a handful per model class)
_SHARED: dict[frozenset[str], SharedFieldsSet] = {}


def share_fields_set(model: BaseModel, *, nested: bool = True) -> None:
    """Make ``model`` (and, with ``nested``, the frozen models among its field values) hold
    the shared set of its given field names.

    A model that is not frozen is left as it is. Costs one frozenset and one lookup.

    >>> rec = Record.model_validate_json(line)      # doctest: +SKIP
    >>> share_fields_set(rec)                       # doctest: +SKIP
    """
    cls = type(model)
    frozen = _FROZEN.get(cls)
    if frozen is None:
        frozen = _FROZEN[cls] = bool(model.model_config.get("frozen"))
    if not frozen:
        return
    names = model.__pydantic_fields_set__
    if type(names) is not SharedFieldsSet:
        key = frozenset(names)
        shared = _SHARED.get(key)
        if shared is None:
            shared = _SHARED.setdefault(key, SharedFieldsSet(key))
        object.__setattr__(model, "__pydantic_fields_set__", shared)
    if nested:
        for value in model.__dict__.values():
            if isinstance(value, BaseModel):
                share_fields_set(value)
