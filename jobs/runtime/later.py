"""Work handed to the worker, once the current transaction commits.

One typed function per Celery task of jobs/tasks.py: a caller writes `later.stop_job(job.id)`,
so a misspelt task or a wrong argument is an error where it is written (and in the linter), not
a name looked up after commit. Rolled back, nothing is queued: the task would act on state
that never existed.

A send after a commit is robust: a broker that refuses the message (down, unreachable) has it
logged (the task and its arguments), not raised after the commit. What was committed stands
and the callbacks after it (the pages' announcements) still run; a request whose change was
recorded does not answer 500, which a user would take for "not created" and submit again. Each
message is one that reconcile sends again from the database (reconcile.py: pending jobs, stuck
starts, followers that stopped beating, attempts left undecided, jobs left Terminating, instances
that outlived their attempt, outputs, expired logs; cleanup.py: resources and orphaned containers,
standbys included). A standby not prepared is a restart that creates its container.
Outside a transaction (reconcile's steps) the task is sent at once and a refusal is raised: the
step stops at the first one rather than wait out the publish retries for every id, and runs
again next round.
"""

from __future__ import annotations

import logging
from uuid import UUID

from django.conf import settings
from django.db import transaction

from jobs import tasks

log = logging.getLogger(__name__)


def _on_commit(task, args: tuple, kwargs: dict | None = None, **options) -> None:
    """The task sent once the current transaction commits, a refusal logged there (naming the
    task and its arguments, for the operator); sent at once, raising, outside a transaction."""

    def send() -> None:
        task.apply_async(args, kwargs, **options)

    if not transaction.get_connection().in_atomic_block:
        send()
        return

    def send_or_log() -> None:
        try:
            send()
        except Exception:
            call = f"{task.name}({', '.join(map(repr, args))})"
            log.warning("could not queue %s; reconcile sends it again", call, exc_info=True)

    transaction.on_commit(send_or_log)


def _after_commit(task, *args, **kwargs) -> None:
    _on_commit(task, args, kwargs)


def schedule_job(job_id: UUID | str) -> None:
    """Schedule the queue the job waits in (schedule.schedule_job)."""
    _after_commit(tasks.schedule_job, str(job_id))


def start_attempt(attempt_id: int) -> None:
    """Create and start an attempt's instances (start.start_attempt)."""
    _after_commit(tasks.start_attempt, attempt_id)


def follow_task_run(task_run_id: int, *, drain: bool = False) -> None:
    """Follow (or, with drain, persist what is left of) an instance's log (follow.py)."""
    _after_commit(tasks.follow_task_run, task_run_id, drain=drain)


def end_attempt(attempt_id: int) -> None:
    """Decide an attempt whose instances may have ended (decide.py)."""
    _after_commit(tasks.end_attempt, attempt_id)


def stop_job(job_id: UUID | str) -> None:
    """Stop a job whose termination was requested, or release a retained one (stop.stop_job);
    reconcile sends the stop of a job left Terminating again."""
    _after_commit(tasks.stop_job, str(job_id))


def stop_instance(task_run_id: int, expires_s: float) -> None:
    """Stop an instance that outlived its ended attempt (stop.stop_outliving_instance); a message
    not taken within expires_s is dropped (reconcile asks again by then)."""
    _on_commit(tasks.stop_instance, (task_run_id,), expires=expires_s)


def job_outputs(job_id: UUID | str) -> None:
    """Auto-publish and log export of an ended job (outputs.py)."""
    _after_commit(tasks.job_outputs, str(job_id))


def delete_job_logs(job_id: UUID | str) -> None:
    """Delete an ended job's persisted logs once their retention is over (outputs.py)."""
    _after_commit(tasks.delete_job_logs, str(job_id))


def release_job_resources(job_id: UUID | str) -> None:
    """Remove an ended job's volumes and code copies from its hosts (cleanup.py)."""
    _after_commit(tasks.release_job_resources, str(job_id))


def prepare_standby(attempt_id: int) -> None:
    """Create the next attempt's container while this one runs (standby.py), once it has run
    STANDBY_AFTER_S."""
    countdown = settings.STANDBY_AFTER_S
    _on_commit(tasks.prepare_standby, (attempt_id,), countdown=countdown)


def remove_standbys(job_id: UUID | str) -> None:
    """Remove an ended job's standby containers (standby.py)."""
    _after_commit(tasks.remove_standbys, str(job_id))
