"""One log format for the gateway and its workers: JSON lines off a TTY, readable on one.

Shared here because a worker's lines and the gateway's lines land in the same
journal and must be read with the same tools.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog


def configure_logging(level: str | None = None, **bound: object) -> None:
    lvl = getattr(logging, (level or "info").upper(), logging.INFO)
    tty = sys.stderr.isatty()
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if bound:
        processors.insert(1, _bind(bound))
    if tty:
        processors.append(structlog.dev.ConsoleRenderer(colors=False))
    else:  # the traceback of log.exception() as an `exception` string, not a bare `exc_info: true`
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        # One write() per line: the gateway and its workers share one stderr, and under
        # PYTHONUNBUFFERED print()'s separate newline let another process's line land in between.
        logger_factory=structlog.WriteLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    logging.basicConfig(
        level=max(lvl, logging.WARNING), stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )


def _bind(values: dict[str, object]) -> structlog.typing.Processor:
    def processor(_logger: Any, _name: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
        for k, v in values.items():
            event.setdefault(k, v)
        return event

    return processor
