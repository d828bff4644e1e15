-- leaseq schema: the tracing context of the enqueuing code (OpenTelemetry, leaseq[otel]).
--
-- Written only when the client has tracing hooks: {"create": carrier} at enqueue (W3C
-- traceparent/tracestate), plus {"attempt": carrier} of the latest failed attempt, which
-- the next attempt's span links to. NULL otherwise. Not part of the payload.
ALTER TABLE {schema}.jobs ADD COLUMN trace_context jsonb;
