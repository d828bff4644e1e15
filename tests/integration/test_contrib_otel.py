"""leaseq.contrib.otel with the OpenTelemetry SDK's in-memory exporter, on a real
PostgreSQL and a real worker: one trace crosses the enqueuing request, the send span, and
each attempt's process span (a retry linking to the failed attempt); batch enqueues get
per-job create spans; without tracing hooks nothing is stored."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode, get_current_span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

import leaseq
from leaseq.contrib.otel import OpenTelemetryTracing
from leaseq.errors import Retry
from leaseq.worker import WorkerConfig, run_worker


@pytest.fixture()
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    yield provider, memory
    provider.shutdown()


def named(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


def test_one_trace_crosses_enqueue_and_each_attempt_with_a_link_on_retry(
    leaseq_dsn: str, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, memory = exporter
    tracing = OpenTelemetryTracing(provider, TraceContextTextMapPropagator())
    app = leaseq.App(leaseq_dsn, tracing=tracing)
    handler_traces: list[int] = []

    @app.task(name="otel.flaky")
    def flaky(ctx: Any, payload: Any) -> None:  # sync: runs in a worker thread
        handler_traces.append(get_current_span().get_span_context().trace_id)
        if ctx.attempt == 1:
            raise Retry("UPSTREAM_BUSY", retry_in=0.01)

    with provider.get_tracer("test").start_as_current_span("POST /orders") as request:
        job_id = flaky.enqueue({"order": 1})
    run_worker(
        app,
        WorkerConfig(queues=("default",), drain=True, poll_interval=0.05),
        install_signal_handlers=False,
    )
    app.close()

    spans = memory.get_finished_spans()
    trace_id = request.get_span_context().trace_id
    (send,) = named(spans, "send default")
    assert send.kind is SpanKind.PRODUCER
    assert send.parent is not None and send.parent.span_id == request.get_span_context().span_id
    assert send.attributes is not None and send.attributes["messaging.message.id"] == str(job_id)

    first, second = sorted(named(spans, "process default"), key=lambda s: s.start_time or 0)
    for attempt, span in enumerate((first, second), start=1):
        assert span.kind is SpanKind.CONSUMER
        assert span.context is not None and span.context.trace_id == trace_id
        assert span.parent is not None and span.parent.span_id == send.context.span_id
        assert span.attributes is not None
        assert span.attributes["messaging.system"] == "leaseq"
        assert span.attributes["messaging.destination.name"] == "default"
        assert span.attributes["messaging.message.id"] == str(job_id)
        assert span.attributes["leaseq.task"] == "otel.flaky"
        assert span.attributes["leaseq.attempt"] == attempt
    assert first.attributes is not None and first.attributes["error.type"] == "UPSTREAM_BUSY"
    assert first.attributes["leaseq.failure_class"] == "transient"
    assert first.status.status_code is StatusCode.ERROR
    assert second.status.status_code is not StatusCode.ERROR
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    assert not first.links
    # The handler ran inside its attempt's span, in the request's trace.
    assert handler_traces == [trace_id, trace_id]
    assert "payload" not in str(first.attributes)


def test_enqueue_many_makes_a_create_span_per_job_and_stores_each_context(
    leaseq_dsn: str, exporter: tuple[TracerProvider, InMemorySpanExporter]
) -> None:
    provider, memory = exporter
    client = leaseq.Client(
        leaseq_dsn, tracing=OpenTelemetryTracing(provider, TraceContextTextMapPropagator())
    )
    ids = client.enqueue_many([{"task": "a", "queue": "q1"}, {"task": "b", "queue": "q2"}])
    spans = memory.get_finished_spans()
    (batch,) = named(spans, "send")
    assert batch.kind is SpanKind.CLIENT
    creates = named(spans, "create q1") + named(spans, "create q2")
    assert [s.attributes["messaging.message.id"] for s in creates if s.attributes] == [
        str(i) for i in ids
    ]
    for job_id, span in zip(ids, creates, strict=True):
        assert span.parent is not None and span.parent.span_id == batch.context.span_id
        stored = client.trace_context(job_id)
        assert stored is not None
        assert f"{span.context.span_id:016x}" in stored["create"]["traceparent"]
    client.close()


def test_without_tracing_hooks_no_context_is_stored(leaseq_client: leaseq.Client) -> None:
    job_id = leaseq_client.enqueue("plain", {})
    assert leaseq_client.trace_context(job_id) is None


def test_a_failed_attempts_trace_is_fenced_by_owner_not_token_alone(
    leaseq_client: leaseq.Client,
) -> None:
    """Boundary: a token that repeats for another lease (a claim lost in a failover, the
    next claim raising the token to the same value). The stale attempt's span must not be
    stored as the job's failed attempt."""
    job_id = leaseq_client.enqueue("plain", {})
    (lease,) = leaseq_client.claim("default", worker="w1", limit=1, lease_seconds=30)
    stale = dataclasses.replace(lease, owner="other-worker/0.1")
    leaseq_client.record_attempt_trace(stale, {"traceparent": "stale"})
    assert leaseq_client.trace_context(job_id) is None
    leaseq_client.record_attempt_trace(lease, {"traceparent": "own"})
    assert leaseq_client.trace_context(job_id) == {"attempt": {"traceparent": "own"}}
