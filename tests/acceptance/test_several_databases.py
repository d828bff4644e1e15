"""Queues on two PostgreSQL clusters: the shared test server (database A, the default) and
a second embedded server started for this module (database B, queue ``emails``).

The boundary is the database: a job, its id, its dependencies and its batch live in the
database of its queue. Enqueue (the routed client, an app's tasks, a handler's own
enqueue) and ``leaseq worker --queue-dsn`` must put and serve each queue where the map
says; whatever would span the two is refused in one line, with nothing stored on either.
"""

from __future__ import annotations

import os
import pathlib
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator

import psycopg
import pytest

import leaseq
from leaseq.dev.embedded import EmbeddedServer
from leaseq.dsn import describe_dsn
from leaseq.errors import ConfigError
from tests.support.helpers import rows
from tests.support.ports import free_port
from tests.support.procs import WorkerProcess, wait_for
from tests.support.scratch import make_scratch

pytestmark = [pytest.mark.requires("postgres-server")]

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dsn_b() -> Iterator[str]:
    base = make_scratch("leaseq-db-b-")  # the server account can reach its data directory
    server = EmbeddedServer(base / "data", port=free_port())
    try:
        yield server.ensure_running()
    finally:
        server.stop()
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture()
def router(dsn: str, dsn_b: str, schema: str) -> Iterator[leaseq.RoutedClient]:
    with leaseq.RoutedClient({"emails": dsn_b}, default=dsn, schema=schema) as routed:
        routed.migrate()
        yield routed
    with psycopg.connect(dsn_b, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


def _count(dsn: str, schema: str, where: str = "true") -> int:
    return int(rows(dsn, f"SELECT count(*) FROM {{s}}.jobs WHERE {where}", schema)[0][0])


def test_each_queue_is_enqueued_and_inspected_on_its_database(
    router: leaseq.RoutedClient, dsn: str, dsn_b: str, schema: str
) -> None:
    a = router.enqueue("hello")
    b = router.enqueue("mail", queue="emails")
    many = router.enqueue_many([{"task": "mail", "queue": "emails"} for _ in range(3)])
    assert isinstance(b, leaseq.RoutedResult) and b.database == dsn_b and a.database == dsn
    assert _count(dsn, schema) == 1 and _count(dsn_b, schema) == 4
    assert _count(dsn, schema, "queue_name = 'emails'") == 0
    job = router.get_job(int(b), queue="emails")
    assert job is not None and job.task == "mail"
    assert len(router.list_jobs("pending", queue="emails")) == 4
    assert {s.queue: s.ready for s in router.queue_stats()} == {"default": 1, "emails": 4}
    chained = router.enqueue_flow(leaseq.chain(leaseq.Sig("mail", None, {"queue": "emails"})))
    assert all(r.database == dsn_b for r in chained) and len(many) == 3


def test_an_apps_tasks_enqueue_on_the_database_of_their_queue(
    router: leaseq.RoutedClient, dsn: str, dsn_b: str, schema: str
) -> None:
    app = leaseq.App(dsn, schema=schema, queues={"emails": dsn_b})
    mail = app.task(name="mail", queue="emails")(lambda ctx, payload: None)
    hello = app.task(name="hello")(lambda ctx, payload: None)
    try:
        mail.enqueue({"n": 1})
        hello.enqueue({"n": 2})
    finally:
        app.close()
    assert _count(dsn_b, schema, "task = 'mail'") == 1 and _count(dsn, schema) == 1


def test_what_would_span_databases_is_refused_in_one_line_and_stores_nothing(
    router: leaseq.RoutedClient, dsn: str, dsn_b: str, schema: str
) -> None:
    on_a = router.enqueue("hello")
    before = (_count(dsn, schema), _count(dsn_b, schema))

    def refused(call: object, match: str) -> None:
        with pytest.raises(ConfigError, match=match) as caught:
            call()  # type: ignore[operator]
        assert "\n" not in str(caught.value) and "nothing was stored" in str(caught.value)

    mixed = [{"task": "hello"}, {"task": "mail", "queue": "emails"}]
    refused(lambda: router.enqueue_many(mixed), "enqueue_many cannot span databases")
    refused(
        lambda: router.enqueue("mail", queue="emails", depends_on=[on_a]),
        "dependencies cannot span databases",
    )
    refused(
        lambda: router.enqueue("mail", queue="emails", depends_on=[leaseq.Dep(on_a, "run")]),
        "dependencies cannot span databases",
    )
    flow = leaseq.chain(leaseq.Sig("hello"), leaseq.Sig("mail", None, {"queue": "emails"}))
    refused(lambda: router.enqueue_flow(flow), "enqueue_many cannot span databases")

    def batch_with_foreign_callback() -> None:
        with router.batch(on_success=leaseq.Sig("mail", None, {"queue": "emails"})):
            pass

    refused(batch_with_foreign_callback, "a batch and its callbacks cannot span databases")

    def batch_with_foreign_job() -> None:
        with router.batch() as batch:
            batch.enqueue("mail", queue="emails")

    refused(batch_with_foreign_job, "a batch cannot span databases")

    def transaction_on_the_other_database() -> None:
        with router.client_for("default").connection() as conn, conn.transaction():
            router.enqueue("mail", queue="emails", connection=conn)

    refused(transaction_on_the_other_database, "a transactional enqueue cannot span databases")
    assert (_count(dsn, schema), _count(dsn_b, schema)) == before
    # The same calls within one database are fine (the batch above was left empty, sealed).
    with router.client_for("emails").connection() as conn, conn.transaction():
        router.enqueue("mail", queue="emails", connection=conn)
    assert _count(dsn_b, schema) == before[1] + 1


def test_a_queue_map_with_a_bad_entry_is_one_line() -> None:
    with pytest.raises(ConfigError, match="expected QUEUE=DSN"):
        leaseq.QueueMap.parse(["emails"])
    with pytest.raises(ConfigError, match="mapped to a database twice"):
        leaseq.QueueMap.parse(["emails=postgresql://a/x", "emails=postgresql://b/y"])
    with pytest.raises(ConfigError, match="invalid queue name"):
        leaseq.QueueMap({" bad name": "postgresql://a/x"})


def test_one_worker_command_serves_queues_on_two_databases(
    router: leaseq.RoutedClient, dsn: str, dsn_b: str, schema: str, tmp_path: pathlib.Path
) -> None:
    """Handlers on A enqueue mail on B; both are served by one ``leaseq worker``; the
    schedule of the emails queue is stored only on B."""
    for _ in range(5):
        router.enqueue("hello")
        router.enqueue("mail", queue="emails")
    args = ("-q", "default", "-q", "emails", "--queue-dsn", f"emails={dsn_b}")
    with WorkerProcess(
        dsn, schema, *args, log_dir=tmp_path, app="tests.support.apps.several:app"
    ) as proc:
        wait_for(
            lambda: (
                _count(dsn, schema, "status = 'succeeded'") == 5
                and _count(dsn_b, schema, "status = 'succeeded'") == 10
            ),
            timeout=60,
            what="both databases drained",
        )
        proc.signal(signal.SIGTERM)
        assert proc.wait(60) == 0, proc.output()
    assert _count(dsn, schema, "queue_name = 'emails'") == 0
    names = "SELECT name FROM {s}.schedules"
    assert rows(dsn_b, names, schema) == [("mail-digest",)]
    assert rows(dsn, names, schema) == []
    output = proc.output()
    assert output.count("worker serving") == 2, output


def test_worker_with_a_bad_queue_dsn_fails_in_one_line(dsn: str, schema: str) -> None:
    env = {**os.environ, "LEASEQ_DSN": dsn, "PYTHONPATH": str(ROOT)}
    app = "tests.support.apps.several:app"
    argv = ["--schema", schema, "worker", app, "-q", "emails", "--queue-dsn", "emails"]
    done = subprocess.run(
        [sys.executable, "-m", "leaseq", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 2
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith("leaseq: error: expected QUEUE=DSN"), line


async def test_the_async_router_routes_and_refuses_the_same_way(
    router: leaseq.RoutedClient, dsn: str, dsn_b: str, schema: str
) -> None:
    async with leaseq.AsyncRoutedClient(
        leaseq.QueueMap({"emails": dsn_b}, default=dsn), schema=schema
    ) as routed:
        b = await routed.enqueue("mail", queue="emails")
        assert isinstance(b, leaseq.RoutedResult) and b.database == dsn_b
        with pytest.raises(ConfigError, match="dependencies cannot span databases"):
            await routed.enqueue("hello", depends_on=[b])
        async with routed.client_for("emails").connection() as conn:
            with pytest.raises(ConfigError, match="transactional enqueue cannot span"):
                async with conn.transaction():
                    await routed.enqueue("hello", connection=conn)
    assert _count(dsn, schema) == 0 and _count(dsn_b, schema) == 1


def test_a_worker_whose_second_database_is_not_migrated_names_it_in_one_line(
    dsn: str, dsn_b: str, client: leaseq.Client
) -> None:
    schema = client.schema  # migrated on A only
    env = {**os.environ, "LEASEQ_DSN": dsn, "PYTHONPATH": str(ROOT)}
    app = "tests.support.apps.several:app"
    argv = ["--schema", schema, "worker", app, "-q", "default", "-q", "emails"]
    done = subprocess.run(
        [sys.executable, "-m", "leaseq", *argv, "--queue-dsn", f"emails={dsn_b}"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "is not set up in this database" in line and describe_dsn(dsn_b) in line, line


def test_supervised_processes_each_serve_both_databases_until_drained(
    router: leaseq.RoutedClient, dsn: str, dsn_b: str, schema: str, tmp_path: pathlib.Path
) -> None:
    for _ in range(20):
        router.enqueue("noop")
        router.enqueue("mail", queue="emails")
    args = ("-q", "default", "-q", "emails", "--queue-dsn", f"emails={dsn_b}")
    with WorkerProcess(
        dsn,
        schema,
        *args,
        "--processes",
        "2",
        "--drain",
        log_dir=tmp_path,
        app="tests.support.apps.several:app",
    ) as proc:
        assert proc.wait(90) == 0, proc.output()
    assert _count(dsn, schema, "status = 'succeeded'") == 20
    assert _count(dsn_b, schema, "status = 'succeeded'") == 20
    assert proc.output().count("worker serving") == 4  # 2 processes x 2 databases
