"""Celery tasks: thin, take ids, and are safe to run twice (see jobs.runtime)."""

from celery import shared_task

from jobs.runtime import lifecycle
from jobs.runtime import reconcile as reconcile_steps


@shared_task
def schedule_job(job_id: str) -> bool:
    return lifecycle.schedule_job(job_id)


@shared_task
def start_attempt(attempt_id: int) -> bool:
    return lifecycle.start_attempt(attempt_id)


@shared_task
def follow_task_run(task_run_id: int) -> bool:
    return lifecycle.follow_task_run(task_run_id)


@shared_task
def end_attempt(attempt_id: int) -> bool:
    return lifecycle.attempt_may_have_ended(attempt_id)


@shared_task
def stop_job(job_id: str) -> bool:
    return lifecycle.stop_job(job_id)


@shared_task
def reconcile() -> list[str]:
    return reconcile_steps.reconcile()
