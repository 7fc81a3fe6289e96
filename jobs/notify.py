"""Notification transports: a registry of small classes, one per kind of topic.

Each transport's send() raises TransportError on a failure worth retrying.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.core.mail import send_mail

from . import outbound
from .models import JobEvent


class TransportError(Exception):
    """A failed send; `retry` False when trying again cannot help (a refused address)."""

    def __init__(self, message: str, *, retry: bool = True):
        super().__init__(message)
        self.retry = retry


def payload(event: JobEvent) -> dict:
    """The event as it was when it happened: a retried delivery must not describe a later job."""
    job = event.job
    data = dict(event.data)
    at_event = data.pop("job_at_event", {})
    return {
        "event": event.kind,
        "at": event.at.isoformat(),
        "message": event.message,
        "data": data,
        "job": {
            "id": str(job.id),
            "name": job.name,
            "project_id": job.workspace.project_id,
            "phase": at_event.get("phase", job.phase),
            "restarts_used": at_event.get("restarts_used", job.restarts_used),
            "max_restarts": job.max_restarts_effective,
        },
    }


class Webhook:
    """A JSON POST through jobs/outbound.py: public addresses only (unless an operator allows a
    network), no redirects, bounded time and size."""

    timeout_s = 5

    def send(self, target: str, event: JobEvent) -> None:
        try:
            response = outbound.post(
                target,
                json.dumps(payload(event)).encode(),
                {"Content-Type": "application/json", "User-Agent": "training-console"},
                timeout_s=self.timeout_s,
            )
        except outbound.OutboundRefused as exc:
            raise TransportError(f"refused: {exc}", retry=False) from exc
        except outbound.OutboundFailed as exc:
            raise TransportError(str(exc)) from exc
        if 300 <= response.status < 400:
            raise TransportError(f"HTTP {response.status}: redirects are not followed.", retry=False)
        if response.status >= 300:
            raise TransportError(f"HTTP {response.status}: {response.text[:200]}")


class Email:
    def send(self, target: str, event: JobEvent) -> None:
        job = event.job
        try:
            send_mail(
                subject=f"[training console] {job.name}: {event.get_kind_display()}",
                message=f"{event.message}\n\nJob {job.name} ({job.id}) is {job.phase}.",
                from_email=settings.DEFAULT_FROM_EMAIL,
                recipient_list=[target],
            )
        except OSError as exc:
            raise TransportError(str(exc)) from exc


TRANSPORTS = {"webhook": Webhook, "email": Email}
