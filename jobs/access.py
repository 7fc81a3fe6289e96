"""Who may see which job: the one filter used by pages, API and websockets."""

from __future__ import annotations

from django.db.models import QuerySet

from .models import TrainingJob, Workspace


def visible_jobs(user) -> QuerySet[TrainingJob]:
    if not user.is_authenticated:
        return TrainingJob.objects.none()
    if user.is_superuser:
        return TrainingJob.objects.all()
    return TrainingJob.objects.filter(workspace__members=user)


def workspaces_of(user) -> QuerySet[Workspace]:
    if user.is_superuser:
        return Workspace.objects.all()
    return Workspace.objects.filter(members=user)
