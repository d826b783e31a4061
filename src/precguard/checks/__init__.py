"""Checks: one module per failure family, registered through the plugin hook.

The contract (:class:`Check`, :class:`Finding`, :class:`CheckContext`) lives in
:mod:`precguard.checks.base`; :mod:`precguard.checks.builtin` registers the
built-in families; :mod:`precguard.checklist` runs them.
"""

from precguard.checks.base import FAMILIES, Check, CheckContext, Finding, NotApplicable, finding

__all__ = ["FAMILIES", "Check", "CheckContext", "Finding", "NotApplicable", "finding"]
