"""How library events reach the host program's logging.

precguard never configures structlog globally: a library imported into a
training script must not print to its stdout. Each module gets a structlog
logger that wraps a standard-library logger (``precguard.*``). The event is
rendered as ``event key=value ...`` for plain handlers, and the structured
data also travels on the record as ``record.precguard_event`` and
``record.precguard_data`` for handlers that want it (the CLI's JSON output).

Warnings and errors therefore reach stderr through Python's last-resort
handler unless the host configures ``logging``; info and debug events stay
silent until the host (or the precguard CLI) turns them on.
"""

from __future__ import annotations

import logging
from typing import Any

import structlog


def _to_stdlib(_logger: Any, _method: str, event_dict: dict[str, Any]) -> tuple[tuple, dict]:
    event = str(event_dict.pop("event", ""))
    exc_info = event_dict.pop("exc_info", None)
    text = " ".join([event, *(f"{k}={v!r}" for k, v in event_dict.items())])
    kwargs: dict[str, Any] = {
        "extra": {"precguard_event": event, "precguard_data": event_dict},
    }
    if exc_info:
        kwargs["exc_info"] = exc_info
    return (text,), kwargs


def get_logger(name: str) -> structlog.stdlib.BoundLogger:
    """Return a structlog logger for module ``name`` that logs through stdlib logging."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[_to_stdlib],
        wrapper_class=structlog.stdlib.BoundLogger,
    )
