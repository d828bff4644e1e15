"""The project's plain leaseq tasks (``LEASEQ["APP"]``): ``manage.py leaseq worker`` runs
them beside the django.tasks tasks."""

from __future__ import annotations

from typing import Any

import leaseq

app = leaseq.App()


@app.task(name="mail.receipt", queue="mail")
def receipt(ctx: leaseq.JobContext, payload: dict[str, Any]) -> None:
    from tests.django_project.shop.models import Receipt

    Receipt.objects.create(order_id=payload["order"])
