"""Scrub secrets from error text before it is stored or logged.

Error details and tracebacks often quote what a handler was holding: a connection string,
an Authorization header, a token in a URL. Everything leaseq stores about a failure first
passes through a redaction hook (``App(redact=...)`` / ``Client(redact=...)``); this is
the default. It is a safety net, not a guarantee: keep secrets out of payloads.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Redactor = Callable[[str], str]

MASK = "***"

_PATTERNS: list[tuple[re.Pattern[str], str]] = [
    # user:password@ in URLs and DSNs
    (re.compile(r"(\b[a-zA-Z][\w+.-]*://[^:/@\s]+:)[^@\s]+@"), rf"\g<1>{MASK}@"),
    # Authorization: Bearer xxx / Basic xxx
    (re.compile(r"\b(Bearer|Basic|Token)\s+[A-Za-z0-9._~+/=-]{8,}", re.I), rf"\1 {MASK}"),
    # key=value / key: value for secret-looking keys (also in JSON and query strings)
    (
        re.compile(
            r"""(?ix)
            (["']?\b(?:password|passwd|pwd|secret|client_secret|token|access_token|
              refresh_token|api[_-]?key|apikey|private[_-]?key|authorization)\b["']?
             \s*[=:]\s*["']?)
            [^\s"'&,;}]+
            """
        ),
        rf"\1{MASK}",
    ),
]


def default_redact(text: str) -> str:
    for pattern, replacement in _PATTERNS:
        text = pattern.sub(replacement, text)
    return text


def no_redact(text: str) -> str:
    return text
