"""The one logging set-up of forkd's processes (the daemon, the operator, the CLI).

    setup(level=None, fmt=None, default_level="INFO")

Level: the argument (--log-level), else $FORKD_LOG_LEVEL, else `default_level`. Format: the argument
(--log-format), else $FORKD_LOG_FORMAT: `text` ("TIME LOGGER LEVEL message key=value...") or `json`, one object
per line with time (ISO 8601, UTC), level, logger, message, the record's extra fields, and exc (the traceback)
when there is one.
Lines go to stderr; calling setup again replaces the handler it installed.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any

from forkd.base.errors import InvalidInput

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
# attributes every LogRecord has: anything else on a record came in through `extra=`
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


def extras(record: logging.LogRecord) -> dict[str, Any]:
    """The fields a record got through `extra=` (kopf's object references, for one)."""
    return {k: v for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")}


class TextFormatter(logging.Formatter):
    """TEXT_FORMAT, then the extra fields as key=value."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        more = " ".join(f"{k}={v}" for k, v in extras(record).items())
        return f"{line} {more}" if more else line


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, extra fields, exc."""

    def format(self, record: logging.LogRecord) -> str:
        obj: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, extra in extras(record).items():
            obj.setdefault(key, extra)
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj, default=str)


class _Handler(logging.StreamHandler):
    """Marks the handler setup() installed, so a second setup() replaces it instead of doubling every line."""


def setup(level: str | None = None, fmt: str | None = None, default_level: str = "INFO") -> None:
    """Log to stderr at `level` in `fmt`; a value not given is read from the settings (FORKD_LOG_LEVEL,
    FORKD_LOG_FORMAT)."""
    if level is None or fmt is None:
        from forkd.base.settings import read_one  # pydantic: only when a value comes from the environment

        level, fmt = level or read_one("log_level") or default_level, fmt or read_one("log_format")
    level, fmt = level.upper(), fmt.lower()
    if level not in LEVELS:
        raise InvalidInput(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    if fmt not in FORMATS:
        raise InvalidInput(f"log format {fmt!r} is not one of {', '.join(FORMATS)}")
    handler = _Handler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    root.handlers[:] = [h for h in root.handlers if not isinstance(h, _Handler)] + [handler]
    root.setLevel(level)
