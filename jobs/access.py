"""Who may see which job, and what an account may create: the one place for both.

`visible_jobs` is the filter used by every page, API view and websocket (SPEC §3
"visibility"); `check_quota` and `check_priority` are the account rules of job
creation (SPEC §3 "quota", "priority"), called by the form and the API alike.
"""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connection
from django.db.models import Q, QuerySet
from django.http import Http404
from django.utils.translation import gettext

from .models import TrainingJob, Workspace

LIST_ALL_JOBS = "jobs.list_all_jobs"
USE_HIGH_PRIORITY = "jobs.use_high_priority"

# SPEC §3 "quota": at most this many jobs per account; the next one is refused.
JOB_QUOTA = 10_000
HIGH_PRIORITY = 3


def visible_jobs(user) -> QuerySet[TrainingJob]:
    """The jobs `user` may see (and act on).

    - a superuser sees every job;
    - a workspace member sees the workspace's jobs, except the creator-only jobs
      of other users, unless they hold "may list all jobs" (jobs.list_all_jobs),
      which shows those too, within their own workspaces;
    - everyone else (anonymous, outsiders) sees nothing.
    """
    if user is None or not user.is_authenticated or not user.is_active:
        return TrainingJob.objects.none()
    if user.is_superuser:
        return TrainingJob.objects.all()
    jobs = TrainingJob.objects.filter(workspace__members=user)
    if not user.has_perm(LIST_ALL_JOBS):
        jobs = jobs.filter(Q(visibility=TrainingJob.Visibility.WORKSPACE) | Q(created_by=user))
    return jobs


def visible_job(user, jobs: QuerySet[TrainingJob] | None = None, **lookup) -> TrainingJob | None:
    """The one job matching `lookup` that `user` may see, or None: `visible_jobs`' rule, with the
    account's permissions asked only for a creator-only job of someone else. The filter asks for
    them on every look-up (two queries, before the job's own); a Stop or a job's API call needs
    one query here."""
    if user is None or not user.is_authenticated or not user.is_active:
        return None
    jobs = TrainingJob.objects.all() if jobs is None else jobs
    if not user.is_superuser:
        jobs = jobs.filter(workspace__members=user)
    job = jobs.filter(**lookup).first()
    if job is None or user.is_superuser or job.visibility == TrainingJob.Visibility.WORKSPACE:
        return job
    return job if job.created_by_id == user.id or user.has_perm(LIST_ALL_JOBS) else None


def may_see_job(user, job_id) -> bool:
    """Whether `user` may see the job: `visible_job`'s rule over the three columns it needs. A
    socket asks again on every recheck and on every change of a job it lists, with the user read
    afresh (no permissions cached): one query, where the filter's `exists()` needed three."""
    return visible_job(user, TrainingJob.objects.only("id", "visibility", "created_by"), id=job_id) is not None


def visible_job_or_404(user, jobs: QuerySet[TrainingJob] | None = None, **lookup) -> TrainingJob:
    """`visible_job` for a page or an API view: a job that does not exist and one the caller may
    not see are the same 404."""
    job = visible_job(user, jobs, **lookup)
    if job is None:
        raise Http404("No such job.")
    return job


def workspaces_of(user) -> QuerySet[Workspace]:
    if user is None or not user.is_authenticated:
        return Workspace.objects.none()
    if user.is_superuser:
        return Workspace.objects.all()
    return Workspace.objects.filter(members=user)


# -- quota --------------------------------------------------------------------------------------------
def quota_message(limit: int = JOB_QUOTA) -> str:
    return gettext(
        "Job quota reached: an account may have at most %(limit)s training jobs. "
        "Delete finished jobs to create new ones."
    ) % {"limit": f"{limit:,}"}


def check_quota(user, adding: int = 1) -> None:
    """Refuse a new job of `user` when the account already has JOB_QUOTA jobs.

    Raises django's ValidationError (code "quota") naming the limit. Inside a
    transaction the user's row is locked first, so two concurrent creations at
    the limit cannot both pass; call it in the transaction that saves the job.
    """
    if user is None or not user.is_authenticated:
        return
    if connection.in_atomic_block:
        get_user_model().objects.select_for_update().filter(pk=user.pk).first()
    if TrainingJob.objects.filter(created_by=user).count() + adding > JOB_QUOTA:
        raise ValidationError(quota_message(), code="quota")


# -- priority ---------------------------------------------------------------------------------------------
def may_use_priority(user, priority) -> bool:
    """Priorities 1 and 2 are anyone's; 3 needs "may use high priority" (jobs.use_high_priority).

    Out-of-range values are the field validator's business: only 3 is refused here.
    """
    try:
        high = int(priority) >= HIGH_PRIORITY
    except (TypeError, ValueError):
        return True
    if not high:
        return True
    return bool(user is not None and user.is_authenticated and user.is_active and user.has_perm(USE_HIGH_PRIORITY))


def check_priority(user, priority) -> None:
    """ValidationError (code "priority") when `user` may not use `priority`."""
    if not may_use_priority(user, priority):
        raise ValidationError(
            gettext('Priority 3 (high) needs the permission "may use high priority"; choose 1 or 2.'), code="priority"
        )
