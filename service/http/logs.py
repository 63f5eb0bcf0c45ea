"""Every worker's logging: one configuration that uvicorn applies in each process it starts (its ``log_config``).

uvicorn configures its own loggers only, so in a worker process the service's lines (``seqrec.*``: reloads,
catalogue changes) had no handler: info lines were dropped and warnings went to Python's last-resort handler,
without level or logger. Here every logger, the service's and uvicorn's, writes to stderr through one format:
text (time, level, logger, pid, message) or, with ``SEQREC_LOG_FORMAT=json``, one JSON object per line.
"""

from __future__ import annotations

import json
import logging
from typing import Any

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(process)d] %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, pid, message (and the traceback, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {"time": self.formatTime(record), "level": record.levelname, "logger": record.name,
                                 "pid": record.process, "message": record.getMessage()}
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, ensure_ascii=False)


def log_config(fmt: str, level: str) -> dict[str, Any]:
    """A `logging.config.dictConfig` for uvicorn's ``log_config``: the service's loggers at ``level`` (uvicorn's
    names: "info", "trace"...), uvicorn's too, all through one handler on stderr."""
    python_level = "DEBUG" if level == "trace" else level.upper()
    formatter = {"()": JsonFormatter} if fmt == "json" else {"format": TEXT_FORMAT}
    # uvicorn sets use_colors on formatters named "default" and "access" when told to; both are this one
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"default": dict(formatter), "access": dict(formatter)},  # dictConfig pops "()"
        "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "default",
                                "stream": "ext://sys.stderr"}},
        "loggers": {
            "seqrec": {"handlers": ["stderr"], "level": python_level, "propagate": False},
            "service": {"handlers": ["stderr"], "level": python_level, "propagate": False},
            "uvicorn": {"handlers": ["stderr"], "level": python_level, "propagate": False},
            "uvicorn.access": {"handlers": ["stderr"], "level": python_level, "propagate": False},
        },
        "root": {"handlers": ["stderr"], "level": "WARNING"},
    }
