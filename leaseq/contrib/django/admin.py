"""A read-only admin of leaseq's jobs, and of dead jobs alone, with replay and cancel
actions that go through the audited client API (the acting user is recorded); a job's page
shows its audit trail (every recorded transition: when, what, who, the error)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

from leaseq.contrib.django.connection import leaseq_app
from leaseq.contrib.django.models import DeadJob, Job


def _actor(request: HttpRequest) -> str:
    return f"django-admin:{request.user}"


@admin.action(description="Replay selected dead jobs")
def replay(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Any]
) -> None:
    client = leaseq_app().client
    done = [
        job.id
        for job in queryset
        if client.replay(job.id, reason="replayed from the Django admin", actor=_actor(request))
    ]
    model_admin.message_user(request, f"replayed {len(done)} of {queryset.count()} job(s)")


@admin.action(description="Cancel selected jobs")
def cancel(
    model_admin: admin.ModelAdmin[Any], request: HttpRequest, queryset: QuerySet[Any]
) -> None:
    client = leaseq_app().client
    done = [
        job.id
        for job in queryset
        if client.cancel(job.id, reason="cancelled from the Django admin", actor=_actor(request))
    ]
    level = messages.INFO if done else messages.WARNING
    model_admin.message_user(request, f"cancelled {len(done)} job(s)", level)


class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "task", "queue_name", "status", "attempt_count", "available_at")
    list_filter = ("status", "queue_name", "task")
    search_fields = ("=id", "task", "last_error_code")
    actions = (replay, cancel)

    def get_readonly_fields(self, request: HttpRequest, obj: Any = None) -> list[str]:
        return [*(field.name for field in self.model._meta.fields), "audit_trail"]

    @admin.display(description="audit trail")
    def audit_trail(self, obj: Any) -> SafeString:
        events = leaseq_app().client.job_events(int(obj.id)) if obj is not None else []
        if not events:
            return format_html("{}", "no recorded transitions")
        rows = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{} &rarr; {}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    e.at.isoformat(timespec="seconds"),
                    e.event,
                    e.from_status or "-",
                    e.to_status or "-",
                    e.actor or "-",
                    e.error_code or "-",
                )
                for e in events
            ),
        )
        head = "<tr><th>at</th><th>event</th><th>move</th><th>actor</th><th>error</th></tr>"
        return format_html("<table>{}{}</table>", SafeString(head), rows)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


class DeadJobAdmin(JobAdmin):
    list_display = ("id", "task", "queue_name", "last_error_code", "attempt_count", "finished_at")
    list_filter = ("queue_name", "task", "last_error_code")


admin.site.register(Job, JobAdmin)
admin.site.register(DeadJob, DeadJobAdmin)
