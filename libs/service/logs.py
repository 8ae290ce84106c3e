"""structlog JSON logs on stdout: one object per line, snake_case events with fields."""

from __future__ import annotations

import logging
import sys

import structlog


def configure_logging(service_name: str, level: str = "info") -> structlog.stdlib.BoundLogger:
    numeric = getattr(logging, level.upper())
    logging.basicConfig(format="%(message)s", stream=sys.stdout, level=numeric, force=True)
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(sort_keys=True),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service_name)
    return structlog.get_logger()
