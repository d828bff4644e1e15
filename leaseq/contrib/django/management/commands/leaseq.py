"""``manage.py leaseq worker|migrate|status``: leaseq's own commands with Django's
settings (the LEASEQ setting, the database alias's connection parameters).

The worker serves, by default, every queue the ``TASKS`` setting's leaseq backends list in
``QUEUES`` plus the queues of the App's own tasks (``LEASEQ["APP"]``); a ``-q`` naming none
of those is refused, as ``leaseq worker`` refuses a queue no task uses."""

from __future__ import annotations

import json
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError, CommandParser

from leaseq.app import App
from leaseq.contrib.django.connection import leaseq_app
from leaseq.errors import LeaseqError
from leaseq.worker import QueueSettings, WorkerConfig, run_worker

_BACKEND = "leaseq.contrib.django.LeaseqBackend"


def backend_queues() -> list[str]:
    """The QUEUES of every ``TASKS`` entry that uses leaseq's backend (Django's default
    for an entry without QUEUES: ``default``), in the order given."""
    found: list[str] = []
    for entry in (getattr(settings, "TASKS", None) or {}).values():
        if entry.get("BACKEND") in (_BACKEND, "leaseq.contrib.django.backend.LeaseqBackend"):
            for queue in entry.get("QUEUES") or ["default"]:
                if queue not in found:
                    found.append(queue)
    return found


def known_queues(app: App) -> list[str]:
    """The queues this project's jobs go to: the backends' QUEUES, then the App's tasks'."""
    found = backend_queues()
    for task in app.tasks.values():
        if task.name != "leaseq.contrib.django.run" and task.queue not in found:
            found.append(task.queue)
    return found or ["default"]


class Command(BaseCommand):
    help = "leaseq: run a worker for the project's tasks, migrate leaseq's schema, show queues."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        worker = sub.add_parser("worker", help="run a worker for the project's tasks")
        worker.add_argument(
            "--queue",
            "-q",
            action="append",
            dest="queues",
            default=None,
            help="queue to serve, repeatable (default: TASKS' QUEUES and the App's queues)",
        )
        worker.add_argument(
            "--any-queue", action="store_true", help="allow a queue no task or backend uses"
        )
        worker.add_argument("--concurrency", "-c", type=int, default=10)
        worker.add_argument("--burst", action="store_true", help="exit once nothing is left to run")
        worker.add_argument(
            "--drain", action="store_true", help="like --burst, also waiting for scheduled jobs"
        )
        worker.add_argument("--worker-id", default=None, help="this worker's name in leases")
        sub.add_parser("migrate", help="create or upgrade leaseq's schema")
        status = sub.add_parser("status", help="per-queue counts")
        status.add_argument("--json", action="store_true", dest="as_json")

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            self._handle(options)
        except LeaseqError as exc:
            raise CommandError(str(exc)) from None

    def _handle(self, options: dict[str, Any]) -> None:
        action = options["action"]
        app = leaseq_app()
        if action == "migrate":
            version = app.client.migrate()
            self.stdout.write(f"leaseq schema {app.schema!r} is at version {version}")
        elif action == "status":
            stats = app.client.queue_stats()
            if options["as_json"]:
                self.stdout.write(json.dumps([s.as_dict() for s in stats], indent=2, default=str))
                return
            for queue in stats:
                self.stdout.write(
                    f"{queue.queue}: {queue.ready} ready, {queue.scheduled} scheduled, "
                    f"{queue.running} running, {queue.dead} dead"
                )
        else:
            self._worker(app, options)

    def _worker(self, app: App, options: dict[str, Any]) -> None:
        known = known_queues(app)
        names = options["queues"] or known
        unknown = [q for q in names if q not in known]
        if unknown and not options["any_queue"]:
            raise CommandError(
                f"queue {unknown[0]!r} is not used by any task or TASKS backend of this "
                f"project (they use: {', '.join(known)}); pass --any-queue to serve it anyway"
            )
        extra: dict[str, Any] = {}
        if options["worker_id"]:
            extra["worker_id"] = options["worker_id"]
        config = WorkerConfig(
            queues=tuple(QueueSettings(name) for name in names),
            concurrency=options["concurrency"],
            burst=options["burst"],
            drain=options["drain"],
            **extra,
        )
        stats = run_worker(app, config, install_signal_handlers=True)
        self.stdout.write(f"{stats.succeeded} succeeded, {stats.failed} failed")
