"""A PostgreSQL server of the sustained run's own (``--own-server``): a new embedded
cluster in a temporary data directory on a free port, so that no other work on the
machine's shared server writes to the same WAL, competes for the same autovacuum workers
or holds back the same xmin horizon while the run watches its table. It preloads
pg_stat_statements (the prune's statement time and rows) and logs every autovacuum run;
it is stopped, and its data directory removed, when the run ends (the autovacuum lines of
its log are kept in a file next to the results).
"""

from __future__ import annotations

import contextlib
import pathlib
import shutil
import tempfile
from collections.abc import Iterator

import psycopg

from bench.sustained.workers import free_ports
from leaseq.dev.embedded import EmbeddedServer

# Set with ALTER SYSTEM (which the embedded server's own settings file leaves alone), then
# the server is restarted once so that the preload takes effect.
SETTINGS = {
    "shared_preload_libraries": "pg_stat_statements",
    "log_autovacuum_min_duration": "0",
}


AUTOVACUUM_LINE = "automatic vacuum of table"


def keep_autovacuum_log(server: EmbeddedServer, keep: pathlib.Path) -> None:
    """Each autovacuum run's log entry (its line and the detail lines after it)."""
    try:
        lines = server.log_file.read_text(errors="replace").splitlines()
    except OSError:
        return
    kept: list[str] = []
    inside = False
    for line in lines:
        if AUTOVACUUM_LINE in line:
            inside = True
        elif not line.startswith(("\t", " ")):
            inside = False
        if inside:
            kept.append(line)
    keep.parent.mkdir(parents=True, exist_ok=True)
    keep.write_text("\n".join(kept) + "\n")


@contextlib.contextmanager
def own_server(keep_log: pathlib.Path) -> Iterator[str]:
    """The DSN of a new embedded server, running until the block ends; its autovacuum log
    entries are then written to ``keep_log``."""
    parent = tempfile.mkdtemp(prefix="leaseq-sustained-pg-")
    pathlib.Path(parent).chmod(0o755)  # run as root, the server account must get through
    server = EmbeddedServer(f"{parent}/data", port=free_ports(1)[0])
    try:
        dsn = server.ensure_running()
        with psycopg.connect(dsn, autocommit=True) as conn:
            for name, value in SETTINGS.items():
                conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        server.stop()
        dsn = server.ensure_running()
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
        yield dsn
    finally:
        try:
            server.stop()
            keep_autovacuum_log(server, keep_log)
        finally:
            shutil.rmtree(parent, ignore_errors=True)
