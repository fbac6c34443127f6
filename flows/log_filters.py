"""Keep tracebacks of user errors out of Prefect's run logs.

Prefect logs every exception that ends a flow or task run with its traceback. For a
`BatonError` (a full disk, a bad model directory, a damaged checkpoint) that traceback
says nothing the one-paragraph message does not, and buries it: `baton run` prints the
message itself when the flow fails. Other exceptions keep their tracebacks.
"""
from __future__ import annotations

import logging

from core.errors import BatonError

RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")


class UserErrorsWithoutTraceback(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if isinstance(record.exc_info, tuple) else None
        if isinstance(exc, BatonError):
            record.exc_info, record.exc_text = None, None
        return True


def hide_user_error_tracebacks() -> None:
    """Install the filter on Prefect's run loggers (once; call after importing prefect)."""
    for name in RUN_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, UserErrorsWithoutTraceback) for f in logger.filters):
            logger.addFilter(UserErrorsWithoutTraceback())
