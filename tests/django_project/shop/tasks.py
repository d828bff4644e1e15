"""django.tasks tasks, run by leaseq's worker through LeaseqBackend."""

from __future__ import annotations

from leaseq.errors import Permanent
from tests.django_project.shop.compat import task
from tests.django_project.shop.models import Receipt


@task()
def send_receipt(order_id: int) -> int:
    return int(Receipt.objects.create(order_id=order_id).id)


@task(queue_name="mail")
def bounce(address: str) -> None:
    raise Permanent("MAILBOX_GONE", f"no mailbox {address}")
