"""Every claim has an identity of its own (``leaseq.owners``), and the fence of a batch
compares owners per job: a batch that mixes claims is still one statement, and a job held
twice (stale and current lease) is never hidden by the other."""

from __future__ import annotations

import datetime as dt
import os

from leaseq.models import Lease
from leaseq.owners import claim_owner, worker_of
from leaseq.params import fence_groups, text_array


def _lease(job_id: int, token: int, owner: str) -> Lease:
    return Lease(
        job_id, token, owner, "t", "q", None, 1, 3, dt.datetime.now(dt.UTC), lease_seconds=30
    )


def test_two_claims_by_one_worker_never_share_an_owner_and_keep_the_worker_prefix() -> None:
    first, second = claim_owner("host:1:ab"), claim_owner("host:1:ab")
    assert first != second
    assert worker_of(first) == worker_of(second) == "host:1:ab"
    assert worker_of("plain-worker") == "plain-worker"


def test_a_forked_child_draws_a_new_nonce() -> None:
    parent = claim_owner("w").rpartition(".")[0]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.write(write, claim_owner("w").rpartition(".")[0].encode())
        os._exit(0)
    os.close(write)
    child = os.read(read, 200).decode()
    os.waitpid(pid, 0)
    os.close(read)
    assert child and child != parent


def test_a_batch_of_several_claims_is_one_fence_with_an_owner_per_job() -> None:
    leases = [_lease(3, 1, "w/a.2"), _lease(1, 1, "w/a.1"), _lease(2, 5, "v/b.1")]
    [fence] = fence_groups(leases)
    assert fence == {"ids": "{1,2,3}", "owners": '{"w/a.1","v/b.1","w/a.2"}', "tokens": "{1,5,1}"}


def test_a_stale_and_a_current_lease_of_one_job_go_to_separate_fences() -> None:
    stale, current = _lease(7, 4, "w/a.1"), _lease(7, 4, "w/a.9")
    fences = fence_groups([stale, current, _lease(8, 1, "w/a.9")])
    assert [f["owners"] for f in fences] == ['{"w/a.1","w/a.9"}', '{"w/a.9"}']


def test_owners_are_quoted_whatever_they_contain() -> None:
    assert text_array(['a"b', "c\\d", "e,f"]) == '{"a\\"b","c\\\\d","e,f"}'
