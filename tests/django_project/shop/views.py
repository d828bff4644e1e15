"""An order view: the order row and its receipt job commit together, or not at all."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, JsonResponse

from tests.django_project.shop.models import Order
from tests.django_project.shop.tasks import send_receipt


def place_order(request: HttpRequest) -> JsonResponse:
    with transaction.atomic():
        order = Order.objects.create(email=request.POST["email"])
        result = send_receipt.enqueue(order.id)
        if request.POST.get("reject"):
            transaction.set_rollback(True)  # e.g. a failed payment: nothing is kept
            return JsonResponse({"rejected": True}, status=409)
    return JsonResponse({"order": order.id, "job": result.id})
