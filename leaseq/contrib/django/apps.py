"""The Django app of leaseq (``INSTALLED_APPS += ["leaseq.contrib.django"]``): the
``leaseq`` management command and the read-only admin."""

from __future__ import annotations

from django.apps import AppConfig


class LeaseqConfig(AppConfig):
    name = "leaseq.contrib.django"
    label = "leaseq"
    verbose_name = "leaseq jobs"
    default_auto_field = "django.db.models.BigAutoField"
