"""OpenTelemetry tracing (extra ``leaseq[otel]``), after the messaging semantic conventions.

    app = leaseq.App(DSN, tracing=OpenTelemetryTracing())

- Enqueue: a PRODUCER span ``send {queue}``; ``enqueue_many``: a CLIENT span ``send`` with
  one PRODUCER span ``create {queue}`` per job. The context (W3C ``traceparent``, through
  the configured propagator) is stored with each job, not in its payload.
- Each attempt: a CONSUMER span ``process {queue}`` whose parent is the job's creation
  context, so the job continues the trace of the code that enqueued it; a retry links to
  the previous failed attempt's span. The handler runs inside it (sync handlers too), so
  its own spans and the jobs it enqueues belong to the trace.
- Attributes: ``messaging.system`` = leaseq, ``messaging.destination.name``,
  ``messaging.operation.type`` / ``.name``, ``messaging.message.id``, ``leaseq.task``,
  ``leaseq.attempt``, ``leaseq.ordering_key``; on failure ``error.type`` (the error code)
  and ``leaseq.failure_class``, with an error status. Payloads are never recorded.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.propagators.textmap import TextMapPropagator
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode

from leaseq.models import Failure, Lease
from leaseq.tracing import Carrier

SYSTEM = "leaseq"


def _attributes(queue: str, operation: str, kind: str, task: str) -> dict[str, Any]:
    return {
        "messaging.system": SYSTEM,
        "messaging.destination.name": queue,
        "messaging.operation.type": kind,
        "messaging.operation.name": operation,
        "leaseq.task": task,
    }


class _Send:
    def __init__(self, spans: Sequence[Span], carriers: Sequence[Carrier | None]) -> None:
        self._spans = spans
        self.carriers = carriers

    def sent(self, job_ids: Sequence[int]) -> None:
        for span, job_id in zip(self._spans, job_ids, strict=True):
            span.set_attribute("messaging.message.id", str(job_id))


class _Process:
    def __init__(self, span: Span, propagator: TextMapPropagator) -> None:
        self._span = span
        self._propagator = propagator

    def finished(self, failure: Failure | None) -> None:
        if failure is None:
            return
        self._span.set_attribute("error.type", failure.error_code)
        self._span.set_attribute("leaseq.failure_class", str(failure.effective_class))
        self._span.set_status(Status(StatusCode.ERROR, failure.error_code))

    def carrier(self) -> Carrier | None:
        carrier: Carrier = {}
        self._propagator.inject(carrier, context=trace.set_span_in_context(self._span))
        return carrier or None


class OpenTelemetryTracing:
    """leaseq's tracing hooks (``leaseq.tracing.Tracing``) for OpenTelemetry. The tracer
    provider and propagator default to the global ones (resolved when used)."""

    def __init__(
        self,
        tracer_provider: trace.TracerProvider | None = None,
        propagator: TextMapPropagator | None = None,
    ) -> None:
        self._provider = tracer_provider
        self._propagator = propagator

    @property
    def tracer(self) -> trace.Tracer:
        return trace.get_tracer("leaseq", tracer_provider=self._provider)

    @property
    def propagator(self) -> TextMapPropagator:
        return self._propagator or propagate.get_global_textmap()

    def _inject(self, span: Span) -> Carrier | None:
        carrier: Carrier = {}
        self.propagator.inject(carrier, context=trace.set_span_in_context(span))
        return carrier or None

    @contextlib.contextmanager
    def send(self, jobs: Sequence[tuple[str, str]]) -> Iterator[_Send]:
        tracer = self.tracer
        if len(jobs) == 1:
            ((queue, task),) = jobs
            with tracer.start_as_current_span(
                f"send {queue}",
                kind=SpanKind.PRODUCER,
                attributes=_attributes(queue, "send", "send", task),
            ) as span:
                yield _Send([span], [self._inject(span)])
            return
        with tracer.start_as_current_span(
            "send",
            kind=SpanKind.CLIENT,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.batch.message_count": len(jobs),
            },
        ):
            creates = [
                tracer.start_span(
                    f"create {queue}",
                    kind=SpanKind.PRODUCER,
                    attributes=_attributes(queue, "create", "create", task),
                )
                for queue, task in jobs
            ]
            try:
                yield _Send(creates, [self._inject(span) for span in creates])
            finally:
                for span in creates:
                    span.end()

    @contextlib.contextmanager
    def process(self, lease: Lease, stored: Mapping[str, Any] | None) -> Iterator[_Process]:
        propagator = self.propagator
        parent = None
        links: list[Link] = []
        if stored:
            if isinstance(stored.get("create"), Mapping):
                parent = propagator.extract(stored["create"])
            if isinstance(stored.get("attempt"), Mapping):
                previous = trace.get_current_span(propagator.extract(stored["attempt"]))
                if previous.get_span_context().is_valid:
                    links.append(Link(previous.get_span_context()))
        attributes = _attributes(lease.queue, "process", "process", lease.task)
        attributes["messaging.message.id"] = str(lease.job_id)
        attributes["leaseq.attempt"] = lease.attempt
        if lease.ordering_key:
            attributes["leaseq.ordering_key"] = lease.ordering_key
        with self.tracer.start_as_current_span(
            f"process {lease.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes=attributes,
        ) as span:
            yield _Process(span, propagator)
