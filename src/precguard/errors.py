"""Errors that reach the user.

Every class here derives from :class:`PrecguardError`. The CLI turns a
``PrecguardError`` into one line on stderr and exit code 2 (``NonFiniteError``
and check failures are results, not usage errors, and say so in their exit
code). Anything else that escapes is a bug in precguard.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """The exit codes of every command, defined once (the results' ``exit_code`` return them).

    ``PASS`` 0: a match, every check passed; ``FAIL`` 1: a divergence, a failed
    check; ``USAGE`` 2: unusable input or usage, one line on stderr;
    ``INCONCLUSIVE`` 3: nothing, or only part, was compared (never a pass).
    """

    PASS = 0
    FAIL = 1
    USAGE = 2
    INCONCLUSIVE = 3


class PrecguardError(Exception):
    """Base class: the input or environment is unusable; the message says why."""

    exit_code: int = ExitCode.USAGE


class UsageError(PrecguardError):
    """Arguments or options that cannot be used together or are malformed."""


class TargetError(PrecguardError):
    """A target could not be found, imported, or built."""


class DeviceUnavailableError(PrecguardError):
    """The requested device cannot be used here (no SDK, no hardware, no plugin)."""


class DumpFormatError(PrecguardError):
    """A recording on disk is missing, corrupt, or of a newer schema.

    The message names the file and, where it applies, the line.
    """


class OutputExistsError(PrecguardError):
    """The output directory exists and is not empty, and overwriting was not asked for."""


class NonFiniteError(PrecguardError):
    """Raised with ``on_nonfinite="raise"`` at the module that introduced NaN/Inf.

    Attributes:
        module: qualified name of the origin module.
        step: step in which it happened.
        key: record key of the first non-finite output.
    """

    exit_code = ExitCode.FAIL

    def __init__(self, message: str, *, module: str, step: int, key: str) -> None:
        super().__init__(message)
        self.module = module
        self.step = step
        self.key = key
