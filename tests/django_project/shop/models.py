"""Orders and the receipts the receipt task writes."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    email = models.TextField()


class Receipt(models.Model):
    order = models.ForeignKey(Order, on_delete=models.CASCADE)
