"""The pure rules of each capability: no I/O, no database, testable alone.

Unique keys (``unique``), limits (``limits``), pauses (``pauses``), dependencies (``deps``),
schedules (``schedules``, and the tick arithmetic in ``schedule_timing``), queue routing
(``routing``) and read replicas (``replicas``). ``leaseq.jobspec`` (a job's options) builds
on them; the operations that apply them are in ``leaseq.ops``, floors up.
"""
