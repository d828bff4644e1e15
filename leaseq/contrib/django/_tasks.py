"""Where ``django.tasks`` lives: in Django itself from 6.0, else in the ``django-tasks``
backport (same layout). Everything is looked up once, by module path."""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any


def _root() -> str:
    for name in ("django.tasks", "django_tasks"):
        try:
            importlib.import_module(name)
        except ImportError:
            continue
        return name
    raise ImportError("leaseq's Django backend needs Django >= 6.0 or the django-tasks package")


ROOT = _root()
base: ModuleType = importlib.import_module(f"{ROOT}.base")
exceptions: ModuleType = importlib.import_module(f"{ROOT}.exceptions")
backends_base: ModuleType = importlib.import_module(f"{ROOT}.backends.base")

BaseTaskBackend: Any = backends_base.BaseTaskBackend
Task: Any = base.Task
TaskContext: Any = base.TaskContext
TaskError: Any = base.TaskError
TaskResult: Any = base.TaskResult
TaskResultStatus: Any = base.TaskResultStatus
TaskResultDoesNotExist: Any = exceptions.TaskResultDoesNotExist
