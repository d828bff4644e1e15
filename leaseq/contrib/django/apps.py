"""The Django app of leaseq (``INSTALLED_APPS += ["leaseq.contrib.django"]``): the
``leaseq`` management command, the read-only admin, and leaseq's schema migrated by
``manage.py migrate`` (so Django's test database has it too)."""

from __future__ import annotations

from django.apps import AppConfig


class LeaseqConfig(AppConfig):
    name = "leaseq.contrib.django"
    label = "leaseq"
    verbose_name = "leaseq jobs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from django.db.models.signals import post_migrate

        from leaseq.contrib.django.connection import migrate_after_django

        post_migrate.connect(migrate_after_django, sender=self)
