"""The pure rules of each capability: no I/O, no database, testable alone.

Unique keys (``unique``), limits (``limits``), pauses (``pauses``), dependencies (``deps``),
workflows (``workflows``), schedules (``schedules`` and the tick arithmetic in
``schedule_timing``), queue routing (``routing``) and read replicas (``replicas``). The
operations that apply them are in ``leaseq.ops``, one floor up.
"""
