"""The instructor token travels in URLs; it must never reach a log file."""
from __future__ import annotations

import logging
import re

TOKEN_IN_QUERY = re.compile(r"((?:^|[?&])token=)[^&\s\"']*")
SERVER_LOGGERS = ("uvicorn.access", "uvicorn.error")


def redact(text: str) -> str:
    return TOKEN_IN_QUERY.sub(r"\1[hidden]", text)


class HideTokens(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and record.args:
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        if isinstance(record.msg, str) and "token=" in record.msg:
            record.msg = redact(record.msg)
        return True


def hide_tokens_in_server_logs() -> None:
    for name in SERVER_LOGGERS:
        logger = logging.getLogger(name)
        if not any(isinstance(f, HideTokens) for f in logger.filters):
            logger.addFilter(HideTokens())
