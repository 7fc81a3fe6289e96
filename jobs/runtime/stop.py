"""Ending a job: finish (with retention, auto stop and the reasons), the user's Stop, and the
containers of an attempt stopped or removed."""

from __future__ import annotations

import logging

from django.db import transaction
from django.utils import timezone

from jobs import events
from jobs.models import FINAL_PHASES, RETAINED_PHASES, Attempt, EventKind, Phase, TaskRun, TrainingJob

from . import engine, later, schedule, standby
from .engine import HOST_ERRORS
from .lifecycle import active_attempt, announce

log = logging.getLogger(__name__)

STOP_TIMEOUT_S = 5


PHASE_EVENTS = {
    Phase.COMPLETED: EventKind.COMPLETED,
    Phase.FAILED: EventKind.FAILED,
    Phase.TERMINATED: EventKind.TERMINATED,
}
RETAINED = {Phase.COMPLETED: Phase.COMPLETED_RETAINED, Phase.FAILED: Phase.FAILED_RETAINED}
RELEASED = {retained: ended for ended, retained in RETAINED.items()}


def finish(job: TrainingJob, phase: str, reason: str) -> None:
    """End the job; with retention a Completed or Failed job keeps its containers (SPEC §3)."""
    # Whole sentences (not "The job {phase}."): jobs/stored_texts.py translates them on a page.
    message = reason or ENDED_MESSAGES.get(phase, f"The job {phase.lower()}.")
    if phase in RETAINED and keeps_containers(job):
        note = retention_note(job.retention_hours)
        phase, reason, message = RETAINED[phase], f"{reason} {note}".strip(), f"{message} {note}"
    elif keeps_containers(job):
        # Terminated: nothing is kept, including what an instance that ended earlier left.
        attempt_ids = list(job.attempts.values_list("id", flat=True))
        transaction.on_commit(lambda: [remove_attempt_containers(a) for a in attempt_ids])
    TrainingJob.objects.filter(id=job.id).update(phase=phase, phase_reason=reason, ended_at=timezone.now())
    events.record(job, PHASE_EVENTS[RELEASED.get(phase, phase)], message)
    announce(job.id)
    transaction.on_commit(lambda: schedule.kick_queue(job))
    later.job_outputs(job.id)  # auto-publish and log export, once (outputs.py)
    if standby.wanted(job):
        later.remove_standbys(job.id)  # kept or not, nothing will start them any more


# -- auto stop and retention (SPEC §3 "more settings") -------------------------------
STOPPED_BY_USER = "Stopped by the user."
ENDED_MESSAGES = {
    Phase.COMPLETED: "The job completed.",
    Phase.FAILED: "The job failed.",
    Phase.TERMINATED: "The job terminated.",
}


def hours_text(hours: int) -> str:
    return "1 hour" if hours == 1 else f"{hours} hours"


def auto_stop_reason(hours: int) -> str:
    if hours == 1:
        return "Auto stopped after 1 hour of running."
    return f"Auto stopped after {hours} hours of running."


def stop_reason(job: TrainingJob) -> str:
    """Why a stopped job ended: auto stop wrote its reason when it asked; otherwise the user stopped it."""
    if job.phase_reason.startswith("Auto stopped after "):
        return job.phase_reason
    return STOPPED_BY_USER


def keeps_containers(job: TrainingJob) -> bool:
    """Retention applies: dedicated pools only, never with fault tolerance (the form refuses both)."""
    return bool(job.retention_hours) and job.dedicated and not job.fault_tolerance


def retention_note(hours: int) -> str:
    return f"Containers kept for {hours_text(hours)} (retention)."


def containers_kept(job_id) -> bool:
    """Whether an ended container of the job stays: the job is retained, or it may still be
    (its other instances run on). A stopped job keeps nothing."""
    job = TrainingJob.objects.filter(id=job_id).first()
    if job is None or not keeps_containers(job):
        return False
    return job.phase in RETAINED_PHASES or not (job.is_final or job.terminate_requested)


def release_retained(job_id) -> bool:
    """Remove a retained job's containers and move it to Completed / Failed: its retention
    is over, or the user stopped it. Idempotent."""
    job = TrainingJob.objects.filter(id=job_id, phase__in=RETAINED_PHASES).first()
    if job is None:
        return False
    for attempt_id in job.attempts.values_list("id", flat=True):
        remove_attempt_containers(attempt_id)
    reason = job.phase_reason.removesuffix(retention_note(job.retention_hours)).strip()
    if job.terminate_requested:
        reason = f"{reason} Containers removed when the user stopped the job."
    else:
        reason = f"{reason} Containers removed after {hours_text(job.retention_hours)}."
    with transaction.atomic():
        released = TrainingJob.objects.filter(id=job.id, phase=job.phase).update(
            phase=RELEASED[job.phase], phase_reason=reason.strip()
        )
        if released:
            announce(job.id)
    return bool(released)


# -- stopping ----------------------------------------------------------------------
def request_terminate(job_id, reason: str = "") -> bool:
    """The user's Stop (or auto stop, with its reason): record the wish; the worker converges.
    Stopping a retained job releases its containers now."""
    now = timezone.now()
    with transaction.atomic():
        wish = TrainingJob.objects.filter(id=job_id, terminate_requested=False)
        # A job that runs or waits first (the common Stop): one UPDATE.
        changed = wish.exclude(phase__in=FINAL_PHASES | RETAINED_PHASES).update(
            terminate_requested=True,
            terminate_requested_at=now,
            phase=Phase.TERMINATING,
            **({"phase_reason": reason} if reason else {}),
        )
        if not changed:
            retained = wish.filter(phase__in=RETAINED_PHASES)
            changed = retained.update(terminate_requested=True, terminate_requested_at=now)
        if changed:
            # The stop task is sent first after the commit, the pages are told after it (a
            # look-up and two publishes): the worker's stop does not wait for them.
            later.stop_job(job_id)
            announce(job_id)
    return bool(changed)


def _containers_of(attempt_id: int):
    for task_run in TaskRun.objects.filter(attempt_id=attempt_id).select_related("host"):
        try:
            yield task_run, engine.container(task_run.host, task_run.container_name)
        except engine.NotFound:
            continue
        except HOST_ERRORS as exc:
            log.warning("cannot reach %s for %s: %s", task_run.host.name, task_run.container_name, exc)


def stop_attempt_containers(attempt_id: int) -> None:
    """docker stop every container of an attempt (the launcher forwards SIGTERM)."""
    for task_run in TaskRun.objects.filter(attempt_id=attempt_id).select_related("host"):
        stop_run_container(task_run)


def stop_run_container(task_run: TaskRun) -> None:
    """docker stop of one instance's container, by its id where the start recorded one: no
    look-up first. One already gone is not an error; an engine's error is logged."""
    try:
        engine.stop_ref(task_run.host, task_run.container_id or task_run.container_name, timeout=STOP_TIMEOUT_S)
    except engine.NotFound:
        pass
    except HOST_ERRORS as exc:
        log.warning("could not stop %s: %s", task_run.container_name, exc)


def stop_outliving_instance(task_run_id: int) -> bool:
    """Stop the container of an instance that outlived its ended attempt (reconcile found it);
    checked again here: a later attempt may restart in it by now, or its end was recorded."""
    task_run = TaskRun.outliving_their_attempt().filter(id=task_run_id).select_related("host").first()
    if task_run is None:
        return False
    log.warning("stopping %s: its attempt ended and it still runs", task_run.container_name)
    stop_run_container(task_run)
    return True


def remove_attempt_containers(attempt_id: int) -> None:
    for task_run, container in _containers_of(attempt_id):
        try:
            engine.remove_container(container)
        except HOST_ERRORS as exc:
            log.warning("could not remove %s: %s", task_run.container_name, exc)


def stop_job(job_id) -> bool:
    """Stop every container of a job whose termination was requested; for a retained job
    (its retention is over, or the user stopped it) remove its containers."""
    from .decide import attempt_may_have_ended

    # What is decided here needs three columns (each branch below reads the job again if it acts
    # on it), not the whole row of a job's settings.
    job = TrainingJob.objects.filter(id=job_id).only("id", "phase", "terminate_requested").first()
    if job is not None and job.phase in RETAINED_PHASES:
        return release_retained(job.id)
    if job is None or not job.terminate_requested or job.is_final:
        return False
    attempt = active_attempt(job)
    if attempt is None:
        with transaction.atomic():
            job = TrainingJob.objects.select_for_update().get(id=job_id)
            if not job.is_final and active_attempt(job) is None:
                finish(job, Phase.TERMINATED, stop_reason(job))
        return True
    runs = list(attempt.task_runs.select_related("host"))
    # A run still "created" has no container yet, unless it restarts in place: the container it
    # reuses runs (the run before's) while the start has not given the go.
    started = [r for r in runs if r.state != TaskRun.State.CREATED or r.reuses_container]
    if attempt.state == Attempt.State.RUNNING or started:
        for task_run in runs:
            stop_run_container(task_run)
    # Followers record the exits; this covers attempts with nothing left to follow.
    attempt_may_have_ended(attempt.id)
    return True
