"""The identity one claim writes into ``lease_owner``: ``<worker id>/<process nonce>.<n>``.

A worker id names a worker (and stays the readable prefix, in logs, ``leaseq jobs`` and the
sweep's "lease of ... expired"); it cannot name a claim, since one worker claims the same
job again after it lost it. That matters after an asynchronous failover: the new primary
never saw the lost claim, so the job's token goes up to the same value a second time, and
a fixed owner would give the old, still running execution the very (owner, token) of the
new one, passing every fence. The nonce is random per process (renewed in a forked child)
and the counter counts this process's claims, so no two claims ever share an identity.
"""

from __future__ import annotations

import itertools
import os
import secrets
import threading

#: What separates the worker id from the claim's own part.
SEPARATOR = "/"

_lock = threading.Lock()
_nonce = secrets.token_hex(4)
_counter = itertools.count(1)


def _renew() -> None:
    global _nonce, _counter, _lock
    _nonce = secrets.token_hex(4)
    _counter = itertools.count(1)
    _lock = threading.Lock()


os.register_at_fork(after_in_child=_renew)


def claim_owner(worker: str) -> str:
    """The ``lease_owner`` of one new claim by ``worker`` (an id already checked)."""
    with _lock:
        n = next(_counter)
    return f"{worker}{SEPARATOR}{_nonce}.{n}"


def worker_of(owner: str) -> str:
    """The worker id an owner names (the owner itself when it has no claim part)."""
    worker, sep, claim = owner.rpartition(SEPARATOR)
    return worker if sep and "." in claim else owner
