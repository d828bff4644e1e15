"""Logging setup for the command line: text for people, JSON lines for log pipelines.

Job transitions are logged by ``leaseq.jobs`` with ``job_id``, ``task``, ``queue``,
``attempt`` and ``token`` as record fields; the JSON format puts every such field at the
top level. Payloads and error details are never logged; messages carry codes.
"""

from __future__ import annotations

import datetime as dt
import json
import logging

_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


def configure(*, level: int, json_format: bool) -> None:
    handler = logging.StreamHandler()
    if json_format:
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # The pool warns once per broken connection it discards; leaseq's own outage log
    # already says the database went away, once.
    logging.getLogger("psycopg.pool").setLevel(logging.ERROR)
