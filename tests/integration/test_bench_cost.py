"""bench.cost's accounting against a real server: the boundary is the statistics flush
between the drain's connection and the read of pg_stat_wal / pg_stat_user_tables. If the
flush were missed the updates would read 0; if the predicate accounting were wrong the
seed's claim (which leaves rows running) would not be charged to its expired-lease index,
nor its completion to the primary key alone."""

from __future__ import annotations

from bench import cost


def test_cost_accounts_every_update_wal_and_each_index_the_new_rows_enter(dsn: str) -> None:
    result = cost.measure(dsn, jobs=300, batch=100)
    for system in ("minimal", "leaseq"):
        for phase in ("claim", "complete"):
            m = result[system][phase]
            assert m["updates_per_job"] == 1.0, (system, phase, m)
            assert m["wal_bytes_per_job"] > 0 and m["wal_records_per_job"] >= 1
    minimal_claim = result["minimal"]["claim"]["index_entries_per_job"]
    assert minimal_claim == {
        "jobs_claimable_idx": 0.0,
        "jobs_expired_lease_idx": 1.0,
        "jobs_pkey": 1.0,
    }
    minimal_complete = result["minimal"]["complete"]["index_entries_per_job"]
    assert minimal_complete["jobs_pkey"] == 1.0 and minimal_complete["jobs_expired_lease_idx"] == 0
    assert result["leaseq"]["claim_explain"]["subplans_ms"]  # leaseq's checks are InitPlans
