"""Precision regression guard: golden recordings kept with the code, and their margins.

:mod:`precguard.testing` is the public entry point (``assert_matches_golden``);
:mod:`precguard.pytest_plugin` wires it into pytest. This package holds what
they share: writing a golden with deterministic bytes (:mod:`.golden`), the
margin of a comparison (:mod:`.margin`) and the results of the precision tests
of one pytest session (:mod:`.session`). Importing it is cheap: nothing here
imports torch at module level.
"""
