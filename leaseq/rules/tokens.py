"""Pure: the HTTP API's bearer tokens. What a token may do (its scopes and queues), how a
token is made (32 random bytes, shown once) and what is stored of it (its SHA-256: the
token is random, so no slow hash is needed to protect it). No I/O here: the operations
are in ``leaseq.ops.tokens_async``, the API in ``leaseq.web.http_api``."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from leaseq import validate
from leaseq.errors import ConfigError

#: enqueue: POST /jobs; read: jobs, results, queues, autoscaling; cancel, replay: those
#: actions; signal: signals to durable jobs.
SCOPES = ("enqueue", "read", "cancel", "replay", "signal")

#: What every token starts with, so a leaked one is recognisable (secret scanners).
PREFIX = "lq_"


def check_scopes(scopes: Iterable[str]) -> list[str]:
    found = list(dict.fromkeys(scopes))
    if not found:
        raise ConfigError(f"a token needs at least one scope ({', '.join(SCOPES)})")
    unknown = [s for s in found if s not in SCOPES]
    if unknown:
        raise ConfigError(f"unknown scope(s) {', '.join(unknown)}: use {', '.join(SCOPES)}")
    return found


def check_queues(queues: Iterable[str] | None) -> list[str] | None:
    """None (or nothing given): every queue."""
    if queues is None:
        return None
    found = [validate.check_name("queue", q) for q in dict.fromkeys(queues)]
    return found or None


def new_token() -> tuple[str, str]:
    """A new token and the hash stored for it."""
    token = PREFIX + secrets.token_urlsafe(32)
    return token, token_hash(token)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


@dataclass(frozen=True)
class ApiToken:
    """A live token as the API sees it; ``queues`` None: every queue."""

    name: str
    scopes: tuple[str, ...]
    queues: tuple[str, ...] | None

    def allows(self, scope: str, queue: str | None = None) -> bool:
        if scope not in self.scopes:
            return False
        return queue is None or self.queues is None or queue in self.queues

    def __str__(self) -> str:
        # The audit trail's actor (job_events, api_requests).
        return self.name
