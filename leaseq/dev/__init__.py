"""Development-only helpers: the private PostgreSQL server that ``leaseq demo``, the test
session and a DSN of ``embedded`` use. The client and the worker import this package only
when no DSN was configured (or ``embedded`` was asked for); the ``leaseq embedded`` commands
import it to manage the server."""
