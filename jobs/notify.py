"""Notification transports: a registry of small classes, one per kind of topic.

Each transport's send() raises TransportError on a failure worth retrying.
"""

from __future__ import annotations

import json

from django.conf import settings
from django.core.mail import send_mail
from django.utils import translation
from django.utils.translation import gettext

from . import outbound, stored_text
from .models import JobEvent, Phase


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
        # The same for every delivery of this event: a receiver drops a repeat (the outbox delivers
        # at least once: a worker that dies after the POST and before recording it sends again).
        "event_id": event.pk,
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
                {
                    "Content-Type": "application/json",
                    "User-Agent": "training-console",
                    "X-Console-Event-Id": str(event.pk),
                },
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


def mail_language(job) -> str:
    """An e-mail is in the language its job's creator chose (console/language.py), else English:
    the worker that sends it serves no request, and the topic's addresses are the team's."""
    from console.language import remembered_language

    return remembered_language(job.created_by) or settings.LANGUAGE_CODE


def email_text(event: JobEvent) -> tuple[str, str]:
    """The subject and body of `event`'s e-mail, in the active language."""
    job = event.job
    subject = gettext("[training console] %(job)s: %(event)s") % {"job": job.name, "event": event.get_kind_display()}
    body = gettext("%(message)s\n\nJob %(job)s (%(id)s) is %(phase)s.") % {
        "message": stored_text.translate(event.message),
        "job": job.name,
        "id": job.id,
        "phase": Phase(job.phase).label if job.phase in Phase.values else job.phase,
    }
    return subject, body


class Email:
    def send(self, target: str, event: JobEvent) -> None:
        with translation.override(mail_language(event.job)):
            subject, body = email_text(event)
        try:
            send_mail(
                subject=subject,
                message=body,
                from_email=settings.DEFAULT_FROM_EMAIL,
                recipient_list=[target],
            )
        except OSError as exc:
            raise TransportError(str(exc)) from exc


TRANSPORTS = {"webhook": Webhook, "email": Email}
