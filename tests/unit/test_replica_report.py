"""The read replica's lag as ``leaseq status`` reports it (pure: rows in, lines and JSON out).

The ``replica_lag`` row carries the answering server; it names where the reads went but
never makes two readings of the same lag unequal. Without a reading (the primary is down)
the report keeps the read DSN, without its password, and says why in one line.
"""

from __future__ import annotations

from leaseq.rules.replicas import ReplicaLag, lag_from_row, reads_from_line, replica_report

READ_DSN = "host=db-standby port=5433 dbname=app user=ro password=s3cret"


def test_the_lag_row_names_the_server_and_equality_ignores_it() -> None:
    caught_up = lag_from_row((True, 0, 12.5, "10.0.0.7:5433"))
    assert caught_up == ReplicaLag(True, 0, 0.0) and caught_up.server == "10.0.0.7:5433"
    behind = lag_from_row((True, 8192, 2.25, "local:5433"))
    assert (behind.bytes, behind.seconds, behind.server) == (8192, 2.25, "local:5433")
    assert lag_from_row((False, None, None, "[::1]:5432")) == ReplicaLag(False, 0, 0.0)


def test_the_report_of_a_reading_and_of_none() -> None:
    lag = lag_from_row((True, 8192, 2.25, "10.0.0.7:5433"))
    assert replica_report(READ_DSN, lag) == {
        "read_dsn": "postgresql://ro@db-standby:5433/app",
        "server": "10.0.0.7:5433",
        "in_recovery": True,
        "lag_seconds": 2.25,
        "lag_bytes": 8192,
        "error": None,
    }
    assert reads_from_line(READ_DSN, lag) == (
        "reads from: 10.0.0.7:5433 (read DSN postgresql://ro@db-standby:5433/app)"
    )
    down = replica_report(READ_DSN, None, ConnectionError("primary gone\nsecond line"))
    assert down["error"] == "primary gone" and down["server"] is None
    assert down["lag_seconds"] is None and "s3cret" not in str(down)
    assert reads_from_line(READ_DSN, None) == (
        "reads from: read DSN postgresql://ro@db-standby:5433/app"
    )
