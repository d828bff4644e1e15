"""Pure helpers of the dashboard: reading and checking what a user typed into a filter or a
form (one clear message for bad input, never a query with it), and formatting (ages, the
inline-SVG sparkline). No I/O.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import zoneinfo
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup

from leaseq.codec import RESERVED_KEYS
from leaseq.states import JobStatus

#: The longest text filter: keys, names and codes are all bounded at or below this.
MAX_TEXT = 200
#: The longest payload filter (JSON text).
MAX_PAYLOAD = 2000
#: The longest reason for an action (the audit trail bounds details at 4000).
MAX_REASON = 1000
#: The deepest nesting a payload filter may have (a deeper one is refused, not recursed).
MAX_DEPTH = 20

TEXT_FILTERS = {
    "queue": "queue",
    "task": "task",
    "error_code": "error code",
    "ordering_key": "ordering key",
    "unique_key": "unique key",
}
STATES = [str(s) for s in JobStatus]


class BadInput(ValueError):
    """What the user typed cannot be used; the message says why, in one line."""


def _shown(value: str) -> str:
    return value if len(value) <= 40 else value[:40] + "…"


def text(form: Mapping[str, Any], name: str, label: str, limit: int = MAX_TEXT) -> str | None:
    """A text field, stripped; None when empty. Refuses overlong or control characters."""
    raw = form.get(name)
    if raw is None:
        return None
    value = str(raw).strip()
    if not value:
        return None
    if len(value) > limit:
        raise BadInput(f"{label} is too long ({len(value)} characters, at most {limit})")
    if any(ord(c) < 32 and c not in "\t\n\r" for c in value) or "\x7f" in value:
        raise BadInput(f"{label} contains control characters")
    if not _encodable(value):
        raise BadInput(f"{label} is not valid Unicode text (a lone surrogate)")
    return value


def _encodable(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _depth(text: str) -> int:
    """How deeply the brackets of JSON text nest (strings skipped), without parsing."""
    deepest = depth = 0
    in_string = escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif char in "]}":
            depth -= 1
    return deepest


def _no_constant(name: str) -> Any:
    raise BadInput(f"payload filter: {name} is not a JSON number")


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise BadInput(f"payload filter: {_shown(text)} is out of range")
    return value


def job_id(raw: object, label: str = "job id") -> int:
    value = str(raw or "").strip()
    if not value.isascii() or not value.isdigit() or len(value) > 18 or int(value) < 1:
        raise BadInput(f"{label} must be a positive whole number, not {_shown(value)!r}")
    return int(value)


def state(form: Mapping[str, Any]) -> str | None:
    value = text(form, "state", "state")
    if value is not None and value not in STATES:
        raise BadInput(f"unknown state {_shown(value)!r} (one of {', '.join(STATES)})")
    return value


def payload(form: Mapping[str, Any], redact: Callable[[str], str] | None = None) -> str | None:
    """The payload containment filter as normalized JSON text (an object or an array).
    Refused: nesting deeper than MAX_DEPTH, NaN/Infinity and numbers out of a double's
    range, lone surrogates, and any filter naming a field the page would show redacted
    (``redact`` changes its text): a filter must not be an oracle for a hidden value."""
    value = text(form, "payload", "payload filter", MAX_PAYLOAD)
    if value is None:
        return None
    if _depth(value) > MAX_DEPTH:
        raise BadInput(f"payload filter nests deeper than {MAX_DEPTH} levels")
    try:
        parsed = json.loads(value, parse_constant=_no_constant, parse_float=_finite)
    except BadInput:
        raise
    except (ValueError, RecursionError):
        parsed = None
    if not isinstance(parsed, dict | list):
        raise BadInput('payload filter must be a JSON object, e.g. {"user": 7}')
    if isinstance(parsed, dict) and parsed.keys() & RESERVED_KEYS:
        raise BadInput("payload filters cannot search encrypted or offloaded payloads")
    normalized = json.dumps(parsed, ensure_ascii=False)
    if "\\u0000" in normalized:
        raise BadInput("payload filter contains a NUL character")
    if not _encodable(normalized):
        raise BadInput("payload filter is not valid Unicode text (a lone surrogate)")
    if redact is not None:
        # The same layout as the job page's payload, so the same fields are masked.
        for layout in (json.dumps(parsed, indent=2, ensure_ascii=False), normalized):
            if redact(layout) != layout:
                raise BadInput("payload filters cannot match redacted fields")
    return normalized


def job_filters(
    form: Mapping[str, Any], redact: Callable[[str], str] | None = None
) -> dict[str, Any]:
    """The job list's filters, checked: state, the text filters, payload, before."""
    found: dict[str, Any] = {name: text(form, name, label) for name, label in TEXT_FILTERS.items()}
    found["state"] = state(form)
    found["payload"] = payload(form, redact)
    before = form.get("before")
    found["before"] = job_id(before, "before") if before else None
    found["created_after"] = moment(form, "created_after", "created after")
    found["created_before"] = moment(form, "created_before", "created before")
    return found


def moment(form: Mapping[str, Any], name: str, label: str) -> dt.datetime | None:
    """A time filter: ISO 8601 (a browser's datetime-local, ``2026-12-04T01:30``), read
    as UTC when it names no zone."""
    value = text(form, name, label, 40)
    if value is None:
        return None
    try:
        found = dt.datetime.fromisoformat(value)
    except ValueError:
        raise BadInput(f"{label} must be a date and time like 2026-12-04T01:30") from None
    if not 1970 <= found.year <= 9999:
        raise BadInput(f"{label} is out of range")
    return found if found.tzinfo is not None else found.replace(tzinfo=dt.UTC)


#: What the job list's bulk selection can do (the form's action -> the label).
BULK_ACTIONS = {"cancel": "Cancel", "replay": "Retry (replay dead)", "delete": "Delete (dead)"}
#: At most this many jobs per bulk action (one page).
MAX_BULK = 100


def selected_ids(form: Any) -> list[int]:
    """The bulk selection's job ids (checkboxes named ``ids``), checked and deduplicated."""
    raw = form.getlist("ids") if hasattr(form, "getlist") else form.get("ids", [])
    ids = list(dict.fromkeys(job_id(value) for value in raw))
    if not ids:
        raise BadInput("select at least one job")
    if len(ids) > MAX_BULK:
        raise BadInput(f"at most {MAX_BULK} jobs at once")
    return ids


def dead_filters(form: Mapping[str, Any]) -> dict[str, Any]:
    """The dead list's filter (what a bulk replay or purge acts on)."""
    return {name: text(form, name, TEXT_FILTERS[name]) for name in ("queue", "task", "error_code")}


def dead_query(filters: Mapping[str, Any]) -> str:
    """The dead list's address for these filters (where a bulk action goes back to)."""
    given = {k: v for k, v in filters.items() if v is not None}
    return "/dead" + ("?" + urlencode(given) if given else "")


def reason(form: Mapping[str, Any], verb: str) -> str:
    value = text(form, "reason", "reason", MAX_REASON)
    if value is None:
        raise BadInput(f"{verb} needs a reason (it is kept in the audit trail)")
    return value


def age(seconds: float | None) -> str:
    """``95.0`` -> ``1m 35s``; empty for nothing."""
    if seconds is None or seconds <= 0:
        return "-"
    whole = int(seconds)
    days, rest = divmod(whole, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d {hours}h"
    if hours:
        return f"{hours}h {minutes}m"
    if minutes:
        return f"{minutes}m {secs}s"
    return f"{secs}s" if whole else f"{seconds:.1f}s"


def duration(seconds: float | None) -> str:
    """A run time: ``0.0123`` -> ``12.3 ms``, ``4.5`` -> ``4.50 s``, longer as an age."""
    if seconds is None:
        return "-"
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    if seconds < 60:
        return f"{seconds:.2f} s"
    return age(seconds)


def when(value: dt.datetime | None) -> str:
    return value.isoformat(sep=" ", timespec="seconds") if value is not None else ""


def when_in(value: dt.datetime | None, tz: str | None) -> str:
    """``value`` in the time zone ``tz`` (a schedule's), with the zone's abbreviation:
    ``2026-03-29 03:00:00 CEST``; UTC when the zone is unknown."""
    if value is None:
        return ""
    try:
        zone = zoneinfo.ZoneInfo(tz or "UTC")
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        zone = zoneinfo.ZoneInfo("UTC")
    local = value.astimezone(zone)
    return f"{local.replace(tzinfo=None).isoformat(sep=' ', timespec='seconds')} {local.tzname()}"


def sparkline(counts: list[int], width: int = 120, height: int = 24) -> Markup:
    """An inline SVG polyline of ``counts`` (no script, no style attribute: CSP-clean)."""
    if not counts:
        counts = [0]
    top = max(counts) or 1
    step = width / max(len(counts) - 1, 1)
    points = " ".join(
        f"{i * step:.1f},{height - 1 - (c / top) * (height - 2):.1f}" for i, c in enumerate(counts)
    )
    return Markup(
        f'<svg class="spark" width="{width}" height="{height}" viewBox="0 0 {width} {height}"'
        f' role="img" aria-label="jobs finished per minute, last hour (max {top})">'
        f'<polyline fill="none" stroke="currentColor" stroke-width="1.5" points="{points}"/>'
        "</svg>"
    )
