"""Read-only, unmanaged models over leaseq's ``jobs`` table, for the admin. They never
write: changes go through leaseq's audited client API (see admin.py). Django creates no
table for them; ``manage.py leaseq migrate`` sets up leaseq's schema."""

from __future__ import annotations

from typing import Any

from django.db import models

from leaseq.contrib.django.connection import options

_TABLE = f'"{options()["SCHEMA"]}"."jobs"'  # quoted: Django keeps it as is, schema included


class ReadOnly(Exception):
    """leaseq's jobs change only through its client API."""


class Job(models.Model):
    id = models.BigIntegerField(primary_key=True)
    queue_name = models.TextField()
    task = models.TextField()
    payload = models.JSONField()
    status = models.TextField()
    priority = models.IntegerField()
    available_at = models.DateTimeField()
    attempt_count = models.IntegerField()
    max_attempts = models.IntegerField()
    lease_owner = models.TextField(null=True)
    lease_token = models.BigIntegerField()
    lease_expires_at = models.DateTimeField(null=True)
    last_error_code = models.TextField(null=True)
    last_error_detail = models.TextField(null=True)
    created_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField(null=True)

    class Meta:
        managed = False
        db_table = _TABLE
        ordering = ("-id",)
        verbose_name = "job"

    def __str__(self) -> str:
        return f"job {self.id} ({self.task}, {self.status})"

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise ReadOnly("leaseq jobs are read-only here; use the admin actions")

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise ReadOnly("leaseq jobs are read-only here; use the admin actions")


class DeadJobManager(models.Manager):
    def get_queryset(self) -> models.QuerySet[DeadJob]:
        return super().get_queryset().filter(status="dead")


class DeadJob(Job):
    objects = DeadJobManager()

    class Meta:
        proxy = True
        verbose_name = "dead job"
