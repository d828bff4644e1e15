"""Django (extra ``leaseq[django]``, Django >= 4.2 with psycopg 3).

- ``connection_for(alias)``: the psycopg connection inside the current ``atomic()`` block,
  to pass as ``connection=`` to ``enqueue``: the job commits or rolls back with it.
- ``LeaseqBackend``: a ``django.tasks`` backend (Django 6, or the ``django-tasks``
  backport): ``@task`` functions enqueue into leaseq and run on ``manage.py leaseq worker``.
- Add ``"leaseq.contrib.django"`` to ``INSTALLED_APPS`` for the ``leaseq`` management
  command (worker, migrate, status) and the read-only admin of jobs and dead jobs.

Settings: ``LEASEQ = {"DATABASE": "default", "SCHEMA": "leaseq", "DSN": None}``; without
a DSN, workers and the admin connect with the DATABASE alias's own parameters.
"""

from __future__ import annotations

from leaseq.contrib.django.backend import LeaseqBackend
from leaseq.contrib.django.connection import connection_for, leaseq_app

__all__ = ["LeaseqBackend", "connection_for", "leaseq_app"]
