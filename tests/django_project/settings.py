"""Settings of the test Django project: PostgreSQL through psycopg 3, leaseq's backend
for django.tasks, the admin."""

from __future__ import annotations

import importlib.util
import os

from psycopg.conninfo import conninfo_to_dict

_db = conninfo_to_dict(os.environ["LEASEQ_DJANGO_TEST_DSN"])

SECRET_KEY = "leaseq-tests-only"
DEBUG = False
USE_TZ = True
ALLOWED_HOSTS = ["testserver"]
ROOT_URLCONF = "tests.django_project.urls"
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db["dbname"],
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": _db.get("port", ""),
        # The testing kit's clock, so leaseq's statements on Django's connection see it too.
        "OPTIONS": {"options": _db["options"]} if _db.get("options") else {},
    }
}
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    *(["django_tasks"] if importlib.util.find_spec("django_tasks") else []),
    "leaseq.contrib.django",
    "tests.django_project.shop",
]
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
TASKS = {
    "default": {
        "BACKEND": "leaseq.contrib.django.LeaseqBackend",
        "QUEUES": ["default", "mail"],
    }
}
LEASEQ = {"DATABASE": "default", "SCHEMA": "leaseq", "APP": "tests.django_project.shop.jobs:app"}
