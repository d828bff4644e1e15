"""The seed's minimal queue, the limit of the problem (issue 35): its table, its two
indexes, its claim (one CTE with ``FOR UPDATE SKIP LOCKED``) and its fenced completion,
batched as ``UPDATE ... FROM unnest``. Nothing of leaseq's schema or statements is used.

``python -P -m bench.minimal --schema S --batch B [--queues Q] [--payload]`` is one drain
process: one autocommit connection claiming ``LIMIT B`` and completing what it claimed,
until a claim returns nothing (with ``--queues Q``: from each of the queues ``q0``...``q{Q-1}``
in turn, until every one came back empty). ``--payload`` makes the claim return each job's
payload too, decoded as a worker would need it (the realistic workloads' payload drains);
without it the claim returns the id and token only, the least a fenced completion needs.
It prints one JSON line, ``{"processed": N, "first_claim": T}``, T the database's
clock (epoch seconds) just before its first claim; the scenario takes the last
``finished_at`` from the table, so the drain is timed on the database's clock from the
first claim to the last completion, as leaseq's drains are (bench.db.drain_span).

``create(conn, schema)`` and ``load(conn, schema, jobs)`` build the table (the seed's DDL,
in a schema of its own) and COPY-load N pending no-op jobs; the scenario calls them
untimed before every sample.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import random
import sys
from collections.abc import Sequence
from typing import Any

import psycopg
from psycopg import sql

# The seed's DDL, verbatim but for the schema: 14 columns, a status enum, the claim's
# partial index and the expired-lease index.
DDL = """
CREATE TYPE {schema}.job_status AS ENUM ('pending', 'running', 'succeeded', 'dead');
CREATE TABLE {schema}.jobs (
  id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  queue_name text NOT NULL,
  payload jsonb NOT NULL,
  status {schema}.job_status NOT NULL DEFAULT 'pending',
  priority integer NOT NULL DEFAULT 0,
  available_at timestamptz NOT NULL DEFAULT now(),
  attempt_count integer NOT NULL DEFAULT 0,
  max_attempts integer NOT NULL DEFAULT 8,
  lease_owner text,
  lease_token bigint NOT NULL DEFAULT 0,
  lease_expires_at timestamptz,
  last_error_code text,
  created_at timestamptz NOT NULL DEFAULT now(),
  finished_at timestamptz
);
CREATE INDEX jobs_claimable_idx ON {schema}.jobs (queue_name, priority DESC, available_at, id)
  WHERE status = 'pending';
CREATE INDEX jobs_expired_lease_idx ON {schema}.jobs (lease_expires_at)
  WHERE status = 'running';
"""

# The seed's claim, with LIMIT B instead of 1.
CLAIM = """
WITH candidate AS (
  SELECT id FROM {schema}.jobs
  WHERE queue_name = %(queue)s AND status = 'pending' AND available_at <= now()
  ORDER BY priority DESC, available_at, id
  FOR UPDATE SKIP LOCKED
  LIMIT %(limit)s
)
UPDATE {schema}.jobs AS j
SET status = 'running', attempt_count = attempt_count + 1, lease_owner = %(owner)s,
    lease_token = lease_token + 1, lease_expires_at = now() + interval '60 seconds'
FROM candidate
WHERE j.id = candidate.id
RETURNING j.id, j.lease_token{returning}
"""

# The seed's fenced completion, for a batch: every row still ours (owner and token) and
# its lease not expired, on the database's clock.
COMPLETE = """
UPDATE {schema}.jobs AS j
SET status = 'succeeded', finished_at = now(), lease_owner = NULL, lease_expires_at = NULL
FROM unnest(%(ids)s::bigint[], %(tokens)s::bigint[]) AS u(id, token)
WHERE j.id = u.id AND j.status = 'running' AND j.lease_owner = %(owner)s
  AND j.lease_token = u.token AND j.lease_expires_at > now()
"""

QUEUE = "default"

# Untimed refill of the backlog scenario: N more pending no-op jobs in the one queue.
REFILL = """
INSERT INTO {schema}.jobs (queue_name, payload)
SELECT 'default', jsonb_build_object('n', g) FROM generate_series(1, %s::int) AS g
"""


def _text(template: str, schema: str, payload: bool = False) -> str:
    text = template.replace("{returning}", ", j.payload" if payload else "")
    return text.replace("{schema}", sql.Identifier(schema).as_string(None))


def queue_names(queues: int) -> list[str]:
    """The queues of a several-queue drain: ``default`` alone, else ``q0``...``q{Q-1}``."""
    return [QUEUE] if queues <= 1 else [f"q{i}" for i in range(queues)]


def pad_text(size: int) -> str:
    """``size`` characters of incompressible text (random base64, the same every call): a
    payload of that size is stored at its size, not squeezed by TOAST's compression."""
    return base64.b64encode(random.Random(size).randbytes(size))[:size].decode()


def create(conn: psycopg.Connection[Any], schema: str) -> None:
    conn.execute(_text(DDL, schema))


def load(
    conn: psycopg.Connection[Any], schema: str, jobs: int, *, pad: int = 0, queues: int = 1
) -> None:
    """Untimed: N pending no-op jobs by COPY (round-robin over ``queue_names(queues)``, each
    payload padded by ``pad`` characters), then VACUUM ANALYZE (as every drain starts)."""
    copy = _text("COPY {schema}.jobs (queue_name, payload) FROM STDIN", schema)
    names, filler = queue_names(queues), pad_text(pad) if pad else None
    with conn.cursor() as cur, cur.copy(copy) as out:
        for n in range(jobs):
            body: dict[str, Any] = {"n": n} if filler is None else {"n": n, "pad": filler}
            out.write_row((names[n % len(names)], json.dumps(body)))
    conn.execute(_text("VACUUM (ANALYZE) {schema}.jobs", schema))


def drain(
    dsn: str, schema: str, batch: int, *, queues: int = 1, payload: bool = False
) -> tuple[int, float]:
    claim, complete = _text(CLAIM, schema, payload), _text(COMPLETE, schema)
    owner = f"bench-minimal:{os.getpid()}"
    active = queue_names(queues)
    params: dict[str, Any] = {"queue": active[0], "owner": owner, "limit": batch}
    done = 0
    with psycopg.connect(dsn, autocommit=True, application_name="leaseq-bench") as conn:
        conn.execute("SET jit = off")  # as the raw drain and the worker's pool run
        row = conn.execute("SELECT extract(epoch FROM clock_timestamp())::float8").fetchone()
        assert row is not None
        first_claim = float(row[0])
        while active:
            for queue in list(active):
                params["queue"] = queue
                rows = conn.execute(claim, params).fetchall()
                if not rows:
                    active.remove(queue)
                    continue
                fence = {  # array literals, as the raw drain sends them
                    "ids": "{" + ",".join(str(r[0]) for r in rows) + "}",
                    "tokens": "{" + ",".join(str(r[1]) for r in rows) + "}",
                    "owner": owner,
                }
                done += conn.execute(complete, fence).rowcount
    return done, first_claim


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.minimal")
    p.add_argument("--schema", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--queues", type=int, default=1)
    p.add_argument("--payload", action="store_true")
    args = p.parse_args(argv)
    dsn = os.environ.get("LEASEQ_DSN", "").strip()
    if not dsn:
        print("python -m bench.minimal: LEASEQ_DSN is not set", file=sys.stderr)
        return 2
    done, first_claim = drain(
        dsn, args.schema, args.batch, queues=args.queues, payload=args.payload
    )
    print(json.dumps({"processed": done, "first_claim": first_claim}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
