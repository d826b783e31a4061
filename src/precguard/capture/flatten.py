"""Find the tensors inside a module's arguments or outputs (:func:`precguard.tree.named_tensors`).

Walks tuples, lists, mappings (including HF ``ModelOutput`` and ``BatchEncoding``)
and dataclasses, with the one walker the whole package uses (:mod:`precguard.tree`).
"""

from __future__ import annotations

from precguard.tree import named_tensors

__all__ = ["named_tensors"]
