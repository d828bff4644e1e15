"""A client stopped between two statements of one operation, on purpose: the boundary a
concurrent path is then run against (tests/integration/test_invariants.py,
test_isolation.py)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from psycopg import Connection

import leaseq
from leaseq.ops.reads_async import Row


class PausingClient(leaseq.Client):
    """A client that stops after one named statement until the test lets it go on: the
    boundary between two statements of one operation, held open on purpose."""

    def __init__(self, *args: Any, pause_after: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pause_after = pause_after
        self.reached = threading.Event()
        self.go = threading.Event()

    def _rows(
        self,
        name: str,
        params: Mapping[str, Any] | None = None,
        connection: Connection[Any] | None = None,
        *,
        tolerant: bool = False,
    ) -> list[Row]:
        found = super()._rows(name, params, connection, tolerant=tolerant)
        if name == self.pause_after and not self.reached.is_set():
            self.reached.set()
            assert self.go.wait(30), "the test never let the paused statement go on"
        return found
