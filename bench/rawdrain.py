"""``python -P -m bench.rawdrain --schema S --batch B``: one process of the raw-SQL drain
limit (the ``drain-raw`` scenario starts 1, 2 or 4 of them at once).

On one autocommit connection it runs leaseq's own ``claim_jobs`` (``LIMIT B``) and fenced
batch ``complete_jobs`` statements in a tight loop until a claim returns nothing: no
asyncio, no pool, no ``Lease`` objects, no handler. The connection runs generic plans only,
and without JIT, as the worker's pool does (``plan_cache_mode = force_generic_plan``,
``jit = off``: a generic claim over a big table otherwise crosses ``jit_above_cost`` and
compiles before every execution, which would make the limit look low). The DSN comes from
``LEASEQ_DSN`` (never argv). It prints one JSON line, ``{"processed": N, "seconds": S}``,
S from the first claim to the last completion as this process saw them.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence

from bench.db import claim_and_complete, claim_params, connect
from leaseq.sql import Queries


def drain(dsn: str, schema: str, batch: int) -> tuple[int, float]:
    queries = Queries(schema)
    claim, complete = queries["claim_jobs"], queries["complete_jobs"]
    params = claim_params(f"bench-raw:{os.getpid()}", batch)
    done = 0
    with connect(dsn) as conn:
        # The best this loop can do, as the worker does it: generic plans only (under the
        # default the claim is re-planned at every execution).
        conn.execute("SET plan_cache_mode = force_generic_plan")
        conn.execute("SET jit = off")
        started = time.perf_counter()
        while n := claim_and_complete(conn, claim, complete, params)[0]:
            done += n
        elapsed = time.perf_counter() - started
    return done, elapsed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.rawdrain")
    p.add_argument("--schema", required=True)
    p.add_argument("--batch", type=int, required=True)
    args = p.parse_args(argv)
    dsn = os.environ.get("LEASEQ_DSN", "").strip()
    if not dsn:
        print("python -m bench.rawdrain: LEASEQ_DSN is not set", file=sys.stderr)
        return 2
    done, elapsed = drain(dsn, args.schema, args.batch)
    print(json.dumps({"processed": done, "seconds": elapsed}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
