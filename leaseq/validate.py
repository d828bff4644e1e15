"""Input checks shared by the client, the worker and the CLI.

Each check raises a :class:`ConfigError` or :class:`PayloadError` whose message names the
bad value and the rule, so a person can fix it from one line.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
from typing import Any

from leaseq.errors import ConfigError, PayloadError

NAME_MAX = 128
_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:\-/]*$")

PRIORITY_MIN = -32768
PRIORITY_MAX = 32767
MAX_ATTEMPTS_LIMIT = 10_000
LEASE_SECONDS_MAX = 7 * 24 * 3600.0
CLAIM_LIMIT_MAX = 1000
DEFAULT_PAYLOAD_LIMIT = 1024 * 1024
ERROR_CODE_MAX = 64
ERROR_DETAIL_MAX = 4000
WORKER_ID_MAX = 200


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def check_name(kind: str, value: object) -> str:
    """Queue and task names: letters, digits and ``_ . : - /``; at most 128 characters."""
    if isinstance(value, str) and _known_good(value):
        return value
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{kind} name must be a non-empty string, got {_short(value)}")
    if len(value) > NAME_MAX or not _NAME_RE.match(value):
        raise ConfigError(
            f"invalid {kind} name {_short(value)}: use letters, digits and _ . : - / "
            f"(at most {NAME_MAX} characters, not starting with punctuation)"
        )
    return value


@functools.lru_cache(maxsize=4096)
def _known_good(value: str) -> bool:
    # Bulk enqueues repeat a handful of names thousands of times: check each once.
    return 0 < len(value) <= NAME_MAX and _NAME_RE.match(value) is not None


def check_int(kind: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{kind} must be an integer, got {_short(value)}")
    if not low <= value <= high:
        raise ConfigError(f"{kind} must be between {low} and {high}, got {value}")
    return value


def check_priority(value: object) -> int:
    return check_int("priority", value, PRIORITY_MIN, PRIORITY_MAX)


def check_max_attempts(value: object) -> int:
    return check_int("max_attempts", value, 1, MAX_ATTEMPTS_LIMIT)


def check_positive_seconds(kind: str, value: object, high: float = LEASE_SECONDS_MAX) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(f"{kind} must be a number of seconds, got {_short(value)}")
    seconds = float(value)
    if not math.isfinite(seconds) or seconds <= 0 or seconds > high:
        raise ConfigError(f"{kind} must be more than 0 and at most {high:g} seconds, got {value}")
    return seconds


def check_payload_version(value: object) -> int | None:
    if value is None:
        return None
    return check_int("payload_version", value, 0, 2**31 - 1)


def check_idempotency_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 200:
        raise ConfigError(
            f"idempotency_key must be a non-empty string of at most 200 characters, "
            f"got {_short(value)}"
        )
    return value


def check_ordering_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 200 or "\x00" in value:
        raise ConfigError(
            f"ordering_key must be a non-empty string of at most 200 characters, "
            f"got {_short(value)}"
        )
    return value


def check_key_policy(value: object) -> str:
    if value not in ("block", "skip"):
        raise ConfigError(f"key_policy must be 'block' or 'skip', got {_short(value)}")
    return str(value)


def parse_duration(text: str) -> float:
    """Seconds from ``90``, ``90s``, ``15m``, ``2h``, ``7d`` or ``1w``."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text or "")
    if not match:
        raise ConfigError(f"invalid duration {text!r}: use e.g. 90s, 15m, 2h, 7d")
    units = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
    return float(match.group(1)) * units[match.group(2)]


def check_worker_id(value: object) -> str:
    if not isinstance(value, str) or not value or len(value) > WORKER_ID_MAX:
        raise ConfigError(
            f"worker id must be a non-empty string of at most {WORKER_ID_MAX} characters, "
            f"got {_short(value)}"
        )
    return value


def schedule(run_at: object, delay: object) -> tuple[dt.datetime | None, float]:
    """Turn ``run_at``/``delay`` into what the insert statement takes.

    ``delay`` is added to the database clock; ``run_at`` is an absolute instant and must
    carry a time zone, since a naive datetime would be read in the server's zone.
    """
    if run_at is not None and delay is not None:
        raise ConfigError("give either run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, dt.datetime) or run_at.tzinfo is None:
            raise ConfigError(f"run_at must be a timezone-aware datetime, got {_short(run_at)}")
        return run_at, 0.0
    if delay is None:
        return None, 0.0
    if isinstance(delay, dt.timedelta):
        delay = delay.total_seconds()
    if isinstance(delay, bool) or not isinstance(delay, int | float) or not math.isfinite(delay):
        raise ConfigError(f"delay must be seconds or a timedelta, got {_short(delay)}")
    if delay < 0:
        raise ConfigError(f"delay must not be negative, got {delay}")
    return None, float(delay)


# One encoder for every payload: json.dumps() with options builds a new one per call.
_PAYLOAD_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def encode_payload(payload: Any, limit: int = DEFAULT_PAYLOAD_LIMIT) -> str:
    """JSON text of ``payload``, refusing what JSON cannot carry and what is too large."""
    try:
        text = _PAYLOAD_ENCODER.encode(payload)
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    if "\\u0000" in text:
        raise PayloadError("payload contains a NUL character, which PostgreSQL jsonb refuses")
    size = len(text) if text.isascii() else len(text.encode("utf-8"))
    if size > limit:
        raise PayloadError(f"payload is {size} bytes, over the limit of {limit} bytes")
    return text


def bound_code(code: object) -> str:
    text = str(code).strip() or "ERROR"
    return text[:ERROR_CODE_MAX]


def bound_detail(detail: object | None) -> str | None:
    if detail is None:
        return None
    text = str(detail).replace("\x00", "")
    if len(text) <= ERROR_DETAIL_MAX:
        return text
    # Keep both ends: the start says what failed, the end of a traceback says where.
    marker = "\n... (truncated) ...\n"
    half = (ERROR_DETAIL_MAX - len(marker)) // 2
    return text[:half] + marker + text[-half:]
