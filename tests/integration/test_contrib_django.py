"""leaseq.contrib.django in a real Django project (tests/django_project) on a real
PostgreSQL: enqueue joins atomic() (commit, rollback, a view), the django.tasks backend
enqueues and a real worker (``manage.py leaseq worker --burst``) runs the task, the kit's
drain runs it inside the test's own transaction, and the admin renders and replays."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import leaseq
from leaseq.testing import Kit
from leaseq.testing.clock import Clock
from leaseq.testing.database import clone, database_dsn, drop_database

django = pytest.importorskip("django")


@pytest.fixture(scope="module")
def django_dsn(leaseq_server_dsn: str, leaseq_template: str) -> Iterator[str]:
    """One database for the module (Django's settings are set once per process)."""
    name = clone(leaseq_server_dsn, leaseq_template)
    dsn = database_dsn(leaseq_server_dsn, name)
    os.environ["LEASEQ_DJANGO_TEST_DSN"] = dsn
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_project.settings"
    django.setup()
    from django.core.management import call_command

    call_command("migrate", run_syncdb=True, verbosity=0)
    yield dsn
    from django.db import connections

    from leaseq.contrib.django import leaseq_app

    leaseq_app().close()
    connections.close_all()
    drop_database(leaseq_server_dsn, name)


@pytest.fixture()
def kit(django_dsn: str) -> Iterator[Kit]:
    client = leaseq.Client(django_dsn)
    yield Kit(client, Clock(django_dsn))
    client.close()


def test_enqueue_joins_atomic_and_commits_with_it(kit: Kit) -> None:
    from django.db import transaction

    from leaseq.contrib.django import connection_for, leaseq_app

    with transaction.atomic():
        leaseq_app().client.enqueue("audit.kept", {"n": 1}, connection=connection_for())
        kit.refute_enqueued("audit.kept")  # another connection cannot see it yet
    kit.assert_enqueued("audit.kept", payload_subset={"n": 1})


def test_enqueue_rolls_back_with_atomic(kit: Kit) -> None:
    from django.db import transaction

    from leaseq.contrib.django import connection_for, leaseq_app
    from tests.django_project.shop.models import Order

    with pytest.raises(RuntimeError), transaction.atomic():
        order = Order.objects.create(email="gone@example.com")
        leaseq_app().client.enqueue("audit.gone", {"order": order.id}, connection=connection_for())
        raise RuntimeError("payment failed")
    kit.refute_enqueued("audit.gone")
    assert not Order.objects.filter(email="gone@example.com").exists()


def test_a_view_commits_the_order_and_its_job_together_or_neither(kit: Kit) -> None:
    from django.test import Client as WebClient

    from leaseq.contrib.django.runtime import DISPATCH_TASK
    from tests.django_project.shop.models import Order

    web = WebClient()
    reply = web.post("/orders", {"email": "a@example.com"})
    assert reply.status_code == 200, reply.content
    order_id = reply.json()["order"]
    job = kit.assert_enqueued(
        DISPATCH_TASK,
        payload_subset={"task": "tests.django_project.shop.tasks.send_receipt", "args": [order_id]},
    )
    assert str(job.job_id) == reply.json()["job"]

    rejected = web.post("/orders", {"email": "b@example.com", "reject": "1"})
    assert rejected.status_code == 409
    assert not Order.objects.filter(email="b@example.com").exists()
    kit.refute_enqueued(DISPATCH_TASK, payload_subset={"args": [order_id + 1]})


def test_backend_enqueues_and_a_real_worker_runs_the_task(kit: Kit) -> None:
    from django.core.management import call_command

    from tests.django_project.shop.models import Order, Receipt
    from tests.django_project.shop.tasks import bounce, send_receipt

    order = Order.objects.create(email="w@example.com")
    result = send_receipt.enqueue(order.id)
    assert result.status == "READY"
    assert send_receipt.get_result(result.id).status == "READY"
    failed = bounce.enqueue("nobody@example.com")

    call_command("leaseq", "worker", "--burst", "-q", "default", "-q", "mail", "-c", "2")

    assert Receipt.objects.filter(order=order).count() == 1
    done = send_receipt.get_result(result.id)
    assert done.status == "SUCCESSFUL" and done.args == [order.id]
    # The return value was stored by the fenced completion.
    assert done.return_value == Receipt.objects.get(order=order).id
    dead = bounce.get_result(failed.id)
    assert dead.status == "FAILED"
    assert dead.errors[0].exception_class_path == "MAILBOX_GONE"


def test_get_result_of_an_unknown_id_does_not_exist(kit: Kit) -> None:
    from leaseq.contrib.django import _tasks
    from tests.django_project.shop.tasks import send_receipt

    job_id = kit.client.enqueue("not.a.django.task", {})
    for result_id in ("999999", "not-a-number", str(job_id)):
        with pytest.raises(_tasks.TaskResultDoesNotExist):
            send_receipt.get_result(result_id)


def test_drain_runs_django_tasks_inside_the_tests_own_transaction(kit: Kit) -> None:
    from django.db import transaction

    from leaseq.contrib.django import connection_for, leaseq_app
    from tests.django_project.shop.models import Order, Receipt
    from tests.django_project.shop.tasks import send_receipt

    succeeded_before = kit.client.count_jobs("succeeded")
    with transaction.atomic():
        order = Order.objects.create(email="tx@example.com")
        send_receipt.enqueue(order.id)
        summary = kit.drain(leaseq_app(), connection=connection_for())
        assert summary.succeeded == 1
        # The task's ORM write went through the same connection: visible here...
        assert Receipt.objects.filter(order=order).count() == 1
        transaction.set_rollback(True)
    # ...and gone with the rollback, the job too.
    assert not Order.objects.filter(email="tx@example.com").exists()
    assert kit.client.count_jobs("succeeded") == succeeded_before


def test_admin_lists_jobs_and_replays_a_dead_one(kit: Kit) -> None:
    from django.contrib.auth.models import User
    from django.test import Client as WebClient

    from tests.django_project.shop.tasks import bounce

    failed = bounce.enqueue("admin@example.com")
    from leaseq.contrib.django import leaseq_app

    summary = kit.drain(leaseq_app(), queue="mail")
    assert summary.dead == 1
    admin_user = User.objects.create_superuser("admin", "admin@example.com", "pw")
    web = WebClient()
    web.force_login(admin_user)

    listing = web.get("/admin/leaseq/job/")
    assert listing.status_code == 200 and b"leaseq.contrib.django.run" in listing.content
    dead_page = web.get("/admin/leaseq/deadjob/")
    assert dead_page.status_code == 200 and b"MAILBOX_GONE" in dead_page.content
    detail = web.get(f"/admin/leaseq/job/{failed.id}/change/")
    assert detail.status_code == 200

    reply = web.post(
        "/admin/leaseq/deadjob/",
        {"action": "replay", "index": 0, "_selected_action": [failed.id]},
        follow=True,
    )
    assert reply.redirect_chain == [("/admin/leaseq/deadjob/", 302)]
    job = kit.client.get_job(int(failed.id))
    assert job is not None and job.status == "pending"
    events = kit.client.job_events(int(failed.id))
    assert events[-1].actor == "django-admin:admin"
    # The job's page shows its audit trail, the replay by the admin user included (issue 30).
    trail = web.get(f"/admin/leaseq/job/{failed.id}/change/").content.decode()
    assert "Audit trail" in trail and "replayed" in trail and "django-admin:admin" in trail
    assert "MAILBOX_GONE" in trail


def test_stale_connection_closing_spares_an_open_atomic_block() -> None:
    from django.db import connection, transaction

    from leaseq.contrib.django.runtime import close_stale_connections

    with transaction.atomic():
        connection.ensure_connection()
        raw: Any = connection.connection
        close_stale_connections()
        assert connection.connection is raw and not raw.closed


def test_plain_leaseq_tasks_of_leaseq_app_run_on_the_worker_serving_tasks_queues(
    kit: Kit,
) -> None:
    """Issue 30: docs/django.md's atomic() example enqueues a plain leaseq task; with
    LEASEQ["APP"] naming the project's App, `manage.py leaseq worker` (no -q: every queue
    of TASKS' QUEUES and of the App's tasks) runs it."""
    from django.core.management import call_command
    from django.db import transaction

    from leaseq.contrib.django import connection_for, leaseq_app
    from tests.django_project.shop.jobs import app as project_app
    from tests.django_project.shop.models import Order, Receipt

    assert leaseq_app() is project_app and "mail.receipt" in project_app.tasks
    with transaction.atomic():
        order = Order.objects.create(email="plain@example.com")
        leaseq_app().client.enqueue(
            "mail.receipt", {"order": order.id}, queue="mail", connection=connection_for()
        )
    call_command("leaseq", "worker", "--burst", "-c", "2")
    assert Receipt.objects.filter(order=order).count() == 1


def test_manage_py_worker_refuses_an_unknown_queue_and_status_speaks_json(kit: Kit) -> None:
    import io
    import json

    from django.core.management import call_command
    from django.core.management.base import CommandError

    with pytest.raises(CommandError, match="queue 'nosuch' is not used by any task"):
        call_command("leaseq", "worker", "--burst", "-q", "nosuch")
    kit.client.enqueue("status.shown", {}, queue="mail")
    out = io.StringIO()
    call_command("leaseq", "status", "--json", stdout=out)
    rows = {row["queue"]: row for row in json.loads(out.getvalue())}
    assert rows["mail"]["ready"] >= 1


def test_djangos_test_database_gets_leaseqs_schema_from_migrate(kit: Kit) -> None:
    """Issue 30: Django's test runner creates its test database and runs `migrate` on it;
    leaseq's schema comes along (post_migrate), and no connection is left to block the
    runner dropping that database at the end."""
    from django.db import connection

    from leaseq.contrib.django import leaseq_app
    from tests.django_project.shop.tasks import send_receipt

    old_name = connection.settings_dict["NAME"]
    # The project's search_path names the kit's clock schema, which a new database lacks
    # (Django would then create its tables in pg_catalog): left out for this database.
    old_options = connection.settings_dict["OPTIONS"]
    connection.settings_dict["OPTIONS"] = {}
    test_name = connection.creation.create_test_db(verbosity=0, autoclobber=True)
    try:
        assert leaseq_app().dsn is not None and test_name in leaseq_app().dsn
        assert leaseq_app().client.schema_version() is not None
        result = send_receipt.enqueue(1)
        assert send_receipt.get_result(result.id).status == "READY"
        leaseq_app().close()
    finally:
        connection.creation.destroy_test_db(old_name, verbosity=0)
        connection.settings_dict["OPTIONS"] = old_options
        connection.close()
    assert old_name in (leaseq_app().dsn or "")  # back on the project's database
