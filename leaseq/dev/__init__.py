"""Development-only helpers: the private PostgreSQL server that ``leaseq demo``, the test
session and a DSN of ``embedded`` use. Nothing in the runtime imports this package unless
no DSN was configured."""
