"""msprobe's record names, and the precguard module names they map onto.

msprobe names a dumped call by what was called and how often:

* a module (level ``L0`` or ``mix``): ``Module.{path}.{Class}.{forward|backward}.{call}``,
  e.g. ``Module.model.layers.0.mlp.LlamaMLP.forward.0``; ``{path}`` is the module's
  qualified name in the model, as in precguard (the root module, when dumped, has
  an empty path and becomes ``root``);
* a module's parameter gradients: ``Module.{path}.{Class}.parameters_grad[.{n}]``;
* an API call (level ``L1`` or ``mix``): ``{Family}.{api}.{count}.{forward|backward}``,
  e.g. ``Functional.linear.3.forward``, ``Tensor.__add__.0.forward``,
  ``Aten.add.Tensor.0.forward``.

precguard records modules only, so an API call is given a module name in its own
namespace, :data:`API_NAMESPACE` (``msprobe_api.Functional.linear``): API records
of two msprobe dumps pair with each other and never with a precguard module.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

#: module-name prefix of API-level records (``msprobe_api.Functional.linear``)
API_NAMESPACE = "msprobe_api"

Kind = Literal["module", "api", "param_grad"]


def is_api_key(key: str) -> bool:
    """Whether a record key is of an API-level record (under :data:`API_NAMESPACE`).

    compare takes such records, when unmatched, as extra detail of an msprobe
    dump, not as evidence of a different model (docs/msprobe.md).
    """
    return key.startswith(API_NAMESPACE + ".")


_COUNT = re.compile(r"0|[1-9][0-9]{0,8}", re.ASCII)
_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_PATH_PART = re.compile(r"[A-Za-z0-9_\-]+", re.ASCII)
_PHASES = ("forward", "backward")


@dataclass(frozen=True)
class MsprobeName:
    """One parsed msprobe record name."""

    kind: Kind
    #: the precguard module name (``model.layers.0.mlp``, ``root``,
    #: ``msprobe_api.Functional.linear``)
    module: str
    #: the module's class (``LlamaMLP``) or the API (``Functional.linear``)
    module_type: str
    phase: Literal["forward", "backward"]
    #: msprobe's counter (for an API: over the whole process, not per step)
    count: int


def parse_name(name: str) -> MsprobeName | None:
    """Parse an msprobe record name; None when it is no module or API call name.

    >>> parse_name("Module.model.layers.0.mlp.LlamaMLP.forward.0").module
    'model.layers.0.mlp'
    >>> parse_name("Functional.linear.3.forward").module
    'msprobe_api.Functional.linear'
    """
    parts = name.split(".")
    if len(parts) < 3 or not all(parts):
        return None
    if parts[0] == "Module":
        return _module_name(parts)
    return _api_name(parts)


def _module_name(parts: list[str]) -> MsprobeName | None:
    if parts[-1] == "parameters_grad" or (
        len(parts) >= 4 and parts[-2] == "parameters_grad" and _COUNT.fullmatch(parts[-1])
    ):
        count = 0 if parts[-1] == "parameters_grad" else int(parts[-1])
        head = parts[1:-1] if parts[-1] == "parameters_grad" else parts[1:-2]
        if not head or not _IDENT.fullmatch(head[-1]):
            return None
        path = head[:-1]
        if not all(_PATH_PART.fullmatch(p) for p in path):
            return None
        return MsprobeName("param_grad", ".".join(path) or "root", head[-1], "backward", count)
    if len(parts) < 4 or parts[-2] not in _PHASES or not _COUNT.fullmatch(parts[-1]):
        return None
    cls, path = parts[-3], parts[1:-3]
    if not _IDENT.fullmatch(cls) or not all(_PATH_PART.fullmatch(p) for p in path):
        return None
    return MsprobeName("module", ".".join(path) or "root", cls, parts[-2], int(parts[-1]))  # type: ignore[arg-type]


def _api_name(parts: list[str]) -> MsprobeName | None:
    if len(parts) < 4 or parts[-1] not in _PHASES or not _COUNT.fullmatch(parts[-2]):
        return None
    api = parts[:-2]
    if not all(_PATH_PART.fullmatch(p) for p in api):
        return None
    api_name = ".".join(api)
    return MsprobeName(
        "api",
        f"{API_NAMESPACE}.{api_name}",
        api_name,
        parts[-1],
        int(parts[-2]),  # type: ignore[arg-type]
    )
