"""Sustained run: leaseq at a fixed offered load for minutes, watching for decay.

The drains of ``python -m bench`` last seconds, on a fresh table. A queue that is fast
for seconds can still slow down over minutes: finished rows pile up until retention
prunes them, dead tuples and index bloat grow until autovacuum catches up, and the worker
process may grow. This run keeps a real ``leaseq worker`` busy at a fixed offered load
(``--rate`` jobs/s, enqueued by this process on a fixed schedule) for ``--minutes``, and
every ``--interval`` seconds samples throughput, backlog, the jobs table's size, its dead
tuples and autovacuum runs, the worker's claim-statement latency and its memory.

It is a measurement: nothing passes or fails on timing. It exits non-zero (one line on
stderr) only when the worker dies or the database cannot be reached.

Usage: ``python -m bench.sustained [--minutes 10] [--rate 5000] [--interval 30]``;
see bench/README.md. The parts: ``model`` (what is sampled, the options), ``workers``
(the worker subprocesses, their /metrics and memory), ``sampling`` (the producer,
snapshots and intervals), ``report`` (tables, summary, JSON), ``cli`` (the run, the
command line).
"""
