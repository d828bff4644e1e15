"""The ``task`` decorator from Django 6 or the django-tasks backport."""

from __future__ import annotations

try:
    from django.tasks import task
except ImportError:
    from django_tasks import task

__all__ = ["task"]
