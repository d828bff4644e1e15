"""Tracing hooks: what leaseq calls around enqueues and attempts when a client or app is
given ``tracing=`` (``leaseq.contrib.otel.OpenTelemetryTracing`` implements them for
OpenTelemetry). The core knows only these protocols and JSON carriers (string maps such
as W3C ``traceparent``); it imports no tracing library.

- ``send(jobs)`` wraps an enqueue of ``(queue, task)`` pairs; its scope gives one carrier
  per job, stored with the job (``jobs.trace_context``, not the payload), and learns the
  job ids once inserted.
- ``process(lease, stored)`` wraps one attempt; ``stored`` is the job's trace context
  (``{"create": carrier, "attempt": carrier of the latest failed attempt}``). Its scope
  learns the outcome, and gives the carrier of the attempt's span, which leaseq stores
  when the attempt failed, so the next attempt can link to it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from leaseq.models import Failure, Lease

Carrier = dict[str, str]


class SendScope(Protocol):
    #: One carrier per job, in the order of the jobs given to ``send``.
    carriers: Sequence[Carrier | None]

    def sent(self, job_ids: Sequence[int]) -> None: ...


class ProcessScope(Protocol):
    def finished(self, failure: Failure | None) -> None:
        """The attempt's outcome: None when the handler succeeded."""

    def carrier(self) -> Carrier | None:
        """The attempt span's context, stored if the attempt failed."""


class Tracing(Protocol):
    def send(self, jobs: Sequence[tuple[str, str]]) -> AbstractContextManager[SendScope]: ...

    def process(
        self, lease: Lease, stored: Mapping[str, Any] | None
    ) -> AbstractContextManager[ProcessScope]: ...
