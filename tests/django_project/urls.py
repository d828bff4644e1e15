"""URLs of the test Django project."""

from __future__ import annotations

from django.contrib import admin
from django.urls import path

from tests.django_project.shop import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders", views.place_order),
]
