"""``manage.py leaseq worker|migrate|status``: leaseq's own commands with Django's
settings (the LEASEQ setting, the database alias's connection parameters)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from leaseq.contrib.django.connection import leaseq_app
from leaseq.worker import QueueSettings, WorkerConfig, run_worker


class Command(BaseCommand):
    help = "leaseq: run a worker for Django's tasks, migrate leaseq's schema, show queues."

    def add_arguments(self, parser: CommandParser) -> None:
        sub = parser.add_subparsers(dest="action", required=True)
        worker = sub.add_parser("worker", help="run a worker for the django.tasks tasks")
        worker.add_argument("--queue", "-q", action="append", dest="queues", default=None)
        worker.add_argument("--concurrency", "-c", type=int, default=10)
        worker.add_argument("--burst", action="store_true", help="exit once nothing is left to run")
        sub.add_parser("migrate", help="create or upgrade leaseq's schema")
        sub.add_parser("status", help="per-queue counts")

    def handle(self, *args: Any, **options: Any) -> None:
        action = options["action"]
        app = leaseq_app()
        if action == "migrate":
            version = app.client.migrate()
            self.stdout.write(f"leaseq schema {app.schema!r} is at version {version}")
        elif action == "status":
            for queue in app.client.queue_stats():
                self.stdout.write(
                    f"{queue.queue}: {queue.ready} ready, {queue.scheduled} scheduled, "
                    f"{queue.running} running, {queue.dead} dead"
                )
        else:
            queues = tuple(QueueSettings(name) for name in options["queues"] or ["default"])
            config = WorkerConfig(
                queues=queues, concurrency=options["concurrency"], burst=options["burst"]
            )
            stats = run_worker(app, config, install_signal_handlers=True)
            self.stdout.write(f"{stats.succeeded} succeeded, {stats.failed} failed")
