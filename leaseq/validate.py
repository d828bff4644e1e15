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
# Patterns that validate input are applied with fullmatch: "$" also matches before a final
# newline, so "name\n" would pass a ``match``.
_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-/]*")

PRIORITY_MIN = -32768
PRIORITY_MAX = 32767
MAX_ATTEMPTS_LIMIT = 10_000
#: A job's defaults, used by every path that makes jobs (leaseq.jobspec's table, schedules,
#: batch callbacks, the CLI); the schema's column defaults are the same (a test checks).
DEFAULT_QUEUE = "default"
DEFAULT_PRIORITY = 0
DEFAULT_MAX_ATTEMPTS = 8
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
    if len(value) > NAME_MAX or not _NAME_RE.fullmatch(value):
        raise ConfigError(
            f"invalid {kind} name {_short(value)}: use letters, digits and _ . : - / "
            f"(at most {NAME_MAX} characters, not starting with punctuation)"
        )
    return value


#: A signal's name, shorter than other names: the wait that takes its k-th delivery is the
#: step ``wait:<name>/<k>``, and a step name has at most NAME_MAX characters.
SIGNAL_NAME_MAX = NAME_MAX - len("wait:") - len("/999999")


def check_signal_name(value: object) -> str:
    """A signal's name: a name (:func:`check_name`) of at most SIGNAL_NAME_MAX characters."""
    name = check_name("signal", value)
    if len(name) > SIGNAL_NAME_MAX:
        raise ConfigError(
            f"signal name {_short(name)} is too long: at most {SIGNAL_NAME_MAX} characters "
            f"(its waits are steps named wait:<signal>/<n>)"
        )
    return name


@functools.lru_cache(maxsize=4096)
def _known_good(value: str) -> bool:
    # Bulk enqueues repeat a handful of names thousands of times: check each once.
    return 0 < len(value) <= NAME_MAX and _NAME_RE.fullmatch(value) is not None


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


def _storable(text: str) -> bool:
    """PostgreSQL text holds neither NUL nor lone surrogates (not valid UTF-8)."""
    if "\x00" in text:
        return False
    if text.isascii():
        return True
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_idempotency_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 200 or not _storable(value):
        raise ConfigError(
            f"idempotency_key must be a non-empty string of at most 200 characters "
            f"(no NUL, valid Unicode), got {_short(value)}"
        )
    return value


def check_ordering_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 200 or not _storable(value):
        raise ConfigError(
            f"ordering_key must be a non-empty string of at most 200 characters "
            f"(no NUL, valid Unicode), got {_short(value)}"
        )
    return value


def check_fairness_key(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value or len(value) > 200 or not _storable(value):
        raise ConfigError(
            f"fairness_key must be a non-empty string of at most 200 characters "
            f"(no NUL, valid Unicode), got {_short(value)}"
        )
    return value


#: The largest cost of a job (jobs_cost_range): the units it takes of each limit.
COST_MAX = 1000


def check_cost(value: object) -> int:
    """A job's cost: the units (slots) it takes of every concurrency limit that applies."""
    return check_int("cost", value, 1, COST_MAX)


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
    if not _storable(value):
        raise ConfigError(f"worker id must not contain NUL or lone surrogates, got {_short(value)}")
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


#: The furthest a start deadline may be, in seconds from now (100 years, as schedules).
EXPIRES_HORIZON = 100 * 365 * 86400.0


def check_expires(value: object) -> tuple[dt.datetime | None, float | None]:
    """``expires=``: an aware datetime (the instant), or seconds / a timedelta counted from
    the enqueue on the database clock. Returns (instant, seconds), at most one of them set."""
    if value is None:
        return None, None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            raise ConfigError(f"expires must be a timezone-aware datetime, got {_short(value)}")
        return value, None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ConfigError(
            f"expires must be seconds, a timedelta or an aware datetime, got {_short(value)}"
        )
    return None, check_positive_seconds("expires", value, EXPIRES_HORIZON)


# One encoder for every payload: json.dumps() with options builds a new one per call.
_PAYLOAD_ENCODER = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)

#: How deeply lists and objects may nest in a payload (``[]`` is one level). The worker
#: decodes payloads with the json module, which recurses once per level and fails near the
#: interpreter's recursion limit (about 1000, less the worker's own frames); 64 leaves a wide
#: margin and is far deeper than any real payload.
PAYLOAD_MAX_DEPTH = 64
_TOO_DEEP = f"payload nests lists and objects more than {PAYLOAD_MAX_DEPTH} levels deep"

# A real NUL is encoded as \u0000 after an odd run of backslashes; "\\u0000" (an escaped
# backslash, then the text u0000) is not one.
_NUL_RE = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")
# An object key given as int, float, bool or None is written as "1":, "1e+20":, "true":,
# "false": or "null":, so every such key ends in one of these. Searching from the literal
# '":' (and ruling out most keys by their last character) keeps the scan cheap; a string key
# that happens to match only costs a precise look.
_CONVERTED_KEY_RE = re.compile(
    r'":(?<=[0-9el]":)(?:(?<=[0-9]":)|(?<=true":)|(?<=false":)|(?<=null":))'
)
_CONTAINERS = (dict, list, tuple)


def encode_payload(payload: Any, limit: int = DEFAULT_PAYLOAD_LIMIT) -> str:
    """JSON text of ``payload``, refusing what JSON cannot carry faithfully (non-string
    object keys), what the worker could not decode (nesting deeper than
    :data:`PAYLOAD_MAX_DEPTH`), what PostgreSQL cannot store (NUL, lone surrogates) and what
    is larger than ``limit`` bytes. Every refusal is a one-line :class:`PayloadError`.

    The structural checks read the encoded text first: a payload can nest more than
    :data:`PAYLOAD_MAX_DEPTH` levels only if it has more brackets than that, and can have
    converted keys only if the key pattern matches. Only such payloads are walked.
    """
    try:
        text = _PAYLOAD_ENCODER.encode(payload)
    except RecursionError:
        raise PayloadError(_TOO_DEEP) from None
    except (TypeError, ValueError) as exc:
        raise PayloadError(f"payload is not JSON-serialisable: {exc}") from None
    if "\\u0000" in text and _NUL_RE.search(text):
        raise PayloadError("payload contains a NUL character, which PostgreSQL jsonb refuses")
    if text.isascii():
        size = len(text)
    else:
        try:
            size = len(text.encode("utf-8"))
        except UnicodeEncodeError as exc:
            raise PayloadError(
                f"payload contains {text[exc.start]!r}, a lone surrogate that is not valid "
                "Unicode text and cannot be stored"
            ) from None
    if size > limit:
        raise PayloadError(f"payload is {size} bytes, over the limit of {limit} bytes")
    deep = size > 2 * PAYLOAD_MAX_DEPTH and text.count("[") + text.count("{") > PAYLOAD_MAX_DEPTH
    keys = _CONVERTED_KEY_RE.search(text) is not None
    if deep or keys:
        _check_structure(payload, keys=keys)
    return text


def _check_structure(payload: Any, *, keys: bool) -> None:
    """Walk the containers of an encodable payload (iteratively, so depth cannot overflow
    the stack): refuse nesting deeper than :data:`PAYLOAD_MAX_DEPTH` and, when ``keys``,
    object keys that are not strings."""
    stack: list[tuple[Any, int]] = [(payload, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > PAYLOAD_MAX_DEPTH:
            raise PayloadError(_TOO_DEEP)
        children: Any = node
        if isinstance(node, dict):
            if keys:
                for key in node:
                    if not isinstance(key, str):
                        raise PayloadError(
                            f"payload has a non-string object key {_short(key)}: JSON keys "
                            "are strings, and converting it could merge it with another "
                            "key; use string keys"
                        )
            children = node.values()
        for child in children:
            if isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1))


def _text_for_storage(text: str) -> str:
    """``text`` without NUL, lone surrogates replaced by "?": error codes and details come
    from handlers' exceptions, and must be stored whatever they hold."""
    text = text.replace("\x00", "")
    if text.isascii():
        return text
    return text.encode("utf-8", "replace").decode("utf-8")


def bound_code(code: object) -> str:
    text = _text_for_storage(str(code)).strip() or "ERROR"
    return text[:ERROR_CODE_MAX]


def bound_detail(detail: object | None) -> str | None:
    if detail is None:
        return None
    text = _text_for_storage(str(detail))
    if len(text) <= ERROR_DETAIL_MAX:
        return text
    # Keep both ends: the start says what failed, the end of a traceback says where.
    marker = "\n... (truncated) ...\n"
    half = (ERROR_DETAIL_MAX - len(marker)) // 2
    return text[:half] + marker + text[-half:]
