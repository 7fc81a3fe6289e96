"""May this grant reach this app now? Asked on every request and every few seconds of a socket."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.sessions.backends.base import SessionBase
from django.utils.module_loading import import_string

from jobs.models import TaskRun
from jobs.terminal import running_task_run

from .origins import Target
from .tickets import Grant


def _session_is_the_users(grant: Grant) -> bool:
    store: SessionBase = import_string(f"{settings.SESSION_ENGINE}.SessionStore")(grant.session_key)
    return store.exists(grant.session_key) and str(store.get("_auth_user_id")) == str(grant.user_id)


def allowed_run(grant: Grant, target: Target) -> tuple[TaskRun | None, str]:
    """The instance's running run when the grant's user (still logged in, still active) may see
    the job and the job asked for the app; else None and what to say (nothing about a job the
    user may not see)."""
    user = get_user_model().objects.filter(pk=grant.user_id, is_active=True).first()
    if user is None or not _session_is_the_users(grant):
        return None, "Your console session has ended: open the app again from the job's page."
    run = running_task_run(user, target.job_id, target.index)
    if run is None:
        return None, f"No running instance {target.index} of this job that you may see."
    if not getattr(run.attempt.job, target.app.field):
        return None, f"This job did not ask for {target.app.name}."
    return run, ""
