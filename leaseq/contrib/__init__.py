"""Integrations with frameworks and libraries, each behind its own extra: nothing here is
imported by leaseq's core (``leaseq.contrib.sqlalchemy``, ``leaseq.contrib.django``,
``leaseq.contrib.starlette``, ``leaseq.contrib.otel``)."""
