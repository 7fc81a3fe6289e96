"""Deciding an attempt's end (SPEC §4): classified from trusted facts, decided by
faulttolerance's policy and escalation, acted on here (restart at a level, re-queue a
preempted job, end the job), with one recovery record per decision.

The claim and the decision are one transaction: exactly one caller decides, and a worker
that dies half-way leaves the attempt for reconcile to bring back here.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from faulttolerance import classify as c
from faulttolerance.models import RecoveryRecord
from faulttolerance.policy import Counters, Decision, Policy, decide, escalate
from jobs import events
from jobs.models import Attempt, EventKind, Phase, TaskRun, TrainingJob

from . import faults, later, placement, reports
from .lifecycle import announce, isolate_host
from .logs import recent_text
from .schedule import new_attempt, pick_hosts
from .stop import finish, remove_attempt_containers, stop_attempt_containers, stop_reason

log = logging.getLogger(__name__)

# Work lost (SPEC §4 evidence), where the job reports it: its progress and checkpoint lines
# (the format of examples/train_checkpoint.py).
PROGRESS_STEP_RE = re.compile(r"^\[progress\] step=(\d+)\b")
CHECKPOINT_STEP_RE = re.compile(r"^\[checkpoint\] (?:saved step=|resumed from step=)(\d+)\b")
NO_CHECKPOINT_LINE = "[checkpoint] no checkpoint, starting from step 0"
WORK_LOST_SCAN_BYTES = 2 * 1024 * 1024  # how far back from the end of the failed run's log to look


@dataclass(frozen=True)
class WorkLost:
    steps: int  # trained since the last checkpoint
    since_ns: int  # when that checkpoint was saved (or the run started without one): its line's time


def work_lost(task_run: TaskRun) -> WorkLost | None:
    """Steps trained since the last checkpoint, from the failed run's own log: its last
    `[progress] step=N` minus its last `[checkpoint] saved step=C` (or the step it resumed
    from, or 0 when it started without a checkpoint), and when that checkpoint line was
    written. None when the job reports no steps or no checkpoint line is within the scanned tail."""
    from .logview import tail_lines  # the lines as a terminal shows them (progress bars redrawn)

    progress = checkpoint = None
    since_ns = 0
    for ts_ns, text in reversed(tail_lines(task_run, None, WORK_LOST_SCAN_BYTES)):
        if progress is None and (m := PROGRESS_STEP_RE.match(text)):
            progress = int(m.group(1))
        elif checkpoint is None and (m := CHECKPOINT_STEP_RE.match(text)):
            checkpoint, since_ns = int(m.group(1)), ts_ns
        elif checkpoint is None and text.startswith(NO_CHECKPOINT_LINE):
            checkpoint, since_ns = 0, ts_ns
        if progress is not None and checkpoint is not None:
            return WorkLost(max(0, progress - checkpoint), since_ns)
    return None


def _failed(task_run: TaskRun) -> bool:
    if task_run.state in (TaskRun.State.START_FAILED, TaskRun.State.LOST) or task_run.hung:
        return True
    return task_run.state == TaskRun.State.EXITED and task_run.exit_code != 0


def attempt_may_have_ended(attempt_id: int) -> bool:
    """Called whenever an instance ended: end the attempt once its fate is known."""
    # One column of the job, not its whole row (some sixty settings, JSON among them, decoded
    # on every instance's end) nor the preempting job's: the claim locks the job's row and reads
    # it again, and the preemption branch reads who preempted after its claim.
    attempt = Attempt.objects.annotate(job_terminating=F("job__terminate_requested")).get(id=attempt_id)
    runs = list(attempt.task_runs.select_related("host"))
    failed = sorted((r for r in runs if _failed(r)), key=lambda r: r.ended_at or timezone.now())
    done = [r for r in runs if r.state not in (TaskRun.State.CREATED, TaskRun.State.RUNNING)]
    terminating = attempt.job_terminating  # unlocked, as the query it replaced was
    preempted = _preempted(attempt)
    stopping = terminating or preempted
    if not failed and not stopping and len(done) < len(runs):
        return False  # the others are still working
    if stopping and attempt.state == Attempt.State.RUNNING and any(r.state == TaskRun.State.RUNNING for r in runs):
        # Wait until every container of a stopped (or preempted) job is gone, so that
        # its capacity is free; instances still "created" were never started and have none.
        return False
    # What the failure's log says is read before any lock is taken (up to a few MB through the
    # terminal emulator): the decision's transaction holds the job's row.
    evidence = _FailureEvidence.of(failed[0]) if failed and not stopping else None
    try:
        decision = _claim_and_decide(attempt, runs, failed, stopping, evidence)
    except _AlreadyClaimed:
        return False
    except Exception as exc:
        # Never leave an attempt undecided: a decision that cannot be made (a bug, a row the
        # code does not expect) ends the job, saying why, rather than leaving it Running.
        log.exception("deciding attempt %s failed", attempt.id)
        return _end_undecidable(attempt, exc)
    in_place = decision is not None and decision.restart and _restarted_in_its_containers(attempt)
    if failed and not in_place and (not terminating or any(r.hung for r in failed)):
        # Collective training cannot go on with one rank gone, and launchers
        # waiting for a decision must end: stop every container of the attempt. (A job being
        # terminated has its stop task for that: its exit codes of 143 are failures here, and
        # a second stop of each ended container is two calls a busy engine answers late. Not
        # for a run ended as hung: its command still runs, and a stop task that met an engine
        # error is not asked again once the job is Terminated.)
        faults.crash_point("before-stopping-the-attempt")
        stop_attempt_containers(attempt.id)
    return True


def _restarted_in_its_containers(attempt: Attempt) -> bool:
    """The decision's next attempt runs on in this one's containers (process level, or a
    reschedule that found a host for the lost instance): they keep running. Not a reschedule
    that found none: it falls back to a job-level restart in new containers (or waits for a
    host), and the instances still running must stop. Made in the decision's transaction."""
    return TaskRun.objects.filter(
        attempt__job_id=attempt.job_id, attempt__number__gt=attempt.number, reuses_container=True
    ).exists()


class _AlreadyClaimed(Exception):
    """Another caller ended (and decided) this attempt."""


@dataclass(frozen=True)
class _FailureEvidence:
    facts: c.EndFacts
    work_lost: WorkLost | None

    @classmethod
    def of(cls, run: TaskRun) -> _FailureEvidence:
        faults.pause_point("reading-failure-evidence")  # a test's slow read (a few MB, a busy machine)
        return cls(_facts(run), work_lost(run))


def _claim_and_decide(
    attempt: Attempt,
    runs: list[TaskRun],
    failed: list[TaskRun],
    stopping: bool,
    evidence: _FailureEvidence | None = None,
) -> Decision | None:
    """End the attempt and decide what follows, in one transaction: a worker that dies
    half-way leaves the attempt running, and reconcile brings it back here."""
    with transaction.atomic():
        # The job's row first (the order every writer of a job and its attempts takes), then
        # the claim: exactly one caller decides for an attempt, however many workers race here.
        job = TrainingJob.objects.select_for_update().get(id=attempt.job_id)
        claim = Attempt.objects.filter(id=attempt.id, state__in=[Attempt.State.STARTING, Attempt.State.RUNNING])
        if stopping:
            # Checked again in the claim itself: `attempt` may be stale, and a start that raced
            # this stop may have made the attempt running with a live container meanwhile; its
            # follower (or the start's own clean-up, for an attempt still starting) comes back.
            claim = claim.exclude(state=Attempt.State.RUNNING, task_runs__state=TaskRun.State.RUNNING)
        if job.terminate_requested:
            # A stop's outcome is known before the claim (the job's row is locked: its wish
            # cannot change), so the claim writes it: one statement fewer on the path a Stop waits on.
            if not claim.update(state=Attempt.State.ENDED, ended_at=timezone.now(), outcome=Attempt.Outcome.TERMINATED):
                raise _AlreadyClaimed
            faults.crash_point("after-claim")
            finish(job, Phase.TERMINATED, stop_reason(job))  # by the user, or by auto stop
            return None
        # Otherwise the outcome follows from whether an instance failed, unless the attempt was
        # preempted. Once ended, no scheduler can claim it any more (it claims running attempts
        # only), so a claim of an attempt not preempted settles that it was not: the common case
        # is one statement, with its outcome, where a claim, a re-read and an outcome were three.
        ended_at = timezone.now()
        outcome = Attempt.Outcome.FAILED if failed else Attempt.Outcome.SUCCEEDED
        preempted = not claim.filter(preempted_at__isnull=True).update(
            state=Attempt.State.ENDED, ended_at=ended_at, outcome=outcome
        )
        if preempted:
            if not claim.update(state=Attempt.State.ENDED, ended_at=ended_at, outcome=Attempt.Outcome.PREEMPTED):
                raise _AlreadyClaimed
            attempt.refresh_from_db(fields=["preempted_at", "preempted_by"])
        attempt.ended_at = ended_at
        faults.crash_point("after-claim")
        decision = None
        if preempted:
            # Before "exited 0 -> Completed" and the failure classes: on SIGTERM a process
            # may exit 0 or 143, and neither is the job's own end.
            _requeue_preempted(job, attempt, runs)
        elif not failed:
            finish(job, Phase.COMPLETED, "")
        else:
            decision = _decide_after_failure(job, attempt, failed[0], evidence or _FailureEvidence.of(failed[0]))
        return decision


def _end_undecidable(attempt: Attempt, exc: Exception) -> bool:
    """The decision raised: end the attempt and the job as Failed with the error, so nothing
    stays Running without a container. False when someone else decided meanwhile."""
    with transaction.atomic():
        job = TrainingJob.objects.select_for_update().get(id=attempt.job_id)
        claimed = Attempt.objects.filter(
            id=attempt.id, state__in=[Attempt.State.STARTING, Attempt.State.RUNNING]
        ).update(state=Attempt.State.ENDED, ended_at=timezone.now(), outcome=Attempt.Outcome.FAILED)
        if not claimed or job.is_final:
            return False
        finish(
            job,
            Phase.FAILED,
            f"The console could not decide what follows attempt {attempt.number} "
            f"({type(exc).__name__}: {str(exc)[:300]}); the job was ended rather than left running.",
        )
    stop_attempt_containers(attempt.id)
    return True


def _preempted(attempt: Attempt) -> bool:
    """The scheduler claimed this attempt for a higher-priority job. The claim wins over
    an end that raced it (the instances ending on their own in the same instant): the
    job runs again rather than being judged on an exit its stop may have caused."""
    return attempt.preempted_at is not None


def _policy_inputs(job: TrainingJob, attempt: Attempt) -> tuple[Policy, Counters, bool]:
    """What policy.decide() needs: the job's HA settings, its counters, and whether the attempt
    ran long enough to count as stable."""
    policy = Policy(job.max_restarts_effective, job.unconditional_restart, job.hang_restart, job.pod_retry_num)
    counters = Counters(
        job.restarts_used,
        job.hang_restarts_used,
        job.consecutive_unconditional,
        job.consecutive_hang,
        job.reschedules_used,
    )
    ran_for = (attempt.ended_at or timezone.now()) - (attempt.started_at or attempt.created_at)
    return policy, counters, ran_for.total_seconds() >= settings.STABLE_WINDOW_S


def _requeue_preempted(job: TrainingJob, attempt: Attempt, runs: list[TaskRun]) -> None:
    """SPEC §4 "preempted": back to Pending with its own priority and age, the restart budget
    untouched; a Preempted event naming the job that needed the room, and the recovery
    record of the decision (policy.decide restarts a preempted job whatever R is)."""
    by = attempt.preempted_by
    by_text = f"{by.name} (priority {by.priority})" if by is not None else "a higher-priority job (since deleted)"
    policy, counters, stable = _policy_inputs(job, attempt)
    decision = decide(policy, counters, c.PREEMPTED, stable=stable, multi_instance=job.node_count > 1)
    after = decision.counters
    TrainingJob.objects.filter(id=job.id).update(
        phase=Phase.PENDING,
        phase_reason=f"Preempted by {by_text}; queued again with priority {job.priority}.",
        consecutive_unconditional=after.consecutive_unconditional,
        consecutive_hang=after.consecutive_hang,
    )
    pool = job.pool.name if job.pool_id else ""
    # Two whole sentences, each a template of jobs/stored_texts.py (a page shows them translated).
    if policy.max_restarts:
        message = (
            f"Preempted by {by_text}, which needed the room on pool {pool}; attempt {attempt.number} stopped and the "
            f"job queued again (restarts used stay {after.restarts_used}/{policy.max_restarts})."
        )
    else:
        message = (
            f"Preempted by {by_text}, which needed the room on pool {pool}; attempt {attempt.number} stopped and the "
            "job queued again."
        )
    events.record(
        job,
        EventKind.PREEMPTED,
        message,
        preempted_by=by.name if by is not None else "",
        preempted_by_id=str(by.id) if by is not None else "",
        preempted_by_priority=by.priority if by is not None else None,
        attempt=attempt.number,
    )
    first = min(runs, key=lambda r: r.index)
    record = RecoveryRecord.from_decision(
        job=job,
        attempt=attempt,
        decision=decision,
        max_restarts=policy.max_restarts,
        failure_class=c.PREEMPTED,
        rule="preempted",
        explanation=f"Stopped by the scheduler to make room for {by_text} on pool {pool}.",
        detected_at=attempt.preempted_at,
        evidence={"preempted_by": by.name if by is not None else "", "preempted_by_id": str(by.id) if by else ""},
    )
    record.exit_code = first.exit_code  # the first instance's, whoever it was: no instance failed
    record.save()
    announce(job.id)
    attempt_id, job_id = attempt.id, str(job.id)
    # The stopped containers hold nothing worth keeping (retention is for ended jobs), and the
    # room they freed is for the job that asked for it: schedule the pool's queue now.
    transaction.on_commit(lambda: remove_attempt_containers(attempt_id))
    later.schedule_job(job_id)


def _facts(run: TaskRun) -> c.EndFacts:
    """What is known of how an instance ended: from the database (the engine's state, written
    by the follower or the start), the launcher's environment-check report, and the log tail,
    which only chooses among the classes of a failure the engine confirmed."""
    env_check = reports.env_check_report(run.attempt.job_id, run.container_name)
    return c.EndFacts(
        exit_code=run.exit_code,
        oom_killed=run.oom_killed,
        lost=run.state == TaskRun.State.LOST,
        hung=run.hung,
        start_error=run.error if run.state == TaskRun.State.START_FAILED else "",
        env_check_failed=bool(env_check and not env_check.passed),
        env_check_detail=env_check.detail if env_check else "",
        log_tail=recent_text(run, 50),
    )


def _env_check_failed_elsewhere_just_before(job: TrainingJob, attempt: Attempt, host_id: int) -> str:
    """The name of the host where this job's environment checks failed right before this
    attempt (the previous decision was that failure, and it led here), if another host."""
    previous = (
        RecoveryRecord.objects.filter(job=job, next_attempt=attempt, failure_class=c.ENV_CHECK_FAILED)
        .order_by("-id")
        .first()
    )
    if previous is None or previous.evidence.get("host_id") in (None, host_id):
        return ""
    return previous.evidence.get("host", "another host")


def _decide_after_failure(
    job: TrainingJob, attempt: Attempt, failed_run: TaskRun, failure: _FailureEvidence
) -> Decision:
    verdict = c.classify(failure.facts) or c.Classification(c.USER_ERROR, "unknown", "The instance failed.")
    policy, counters, stable = _policy_inputs(job, attempt)
    isolate = verdict.failure_class in (c.ENV_CHECK_FAILED, c.NODE_FAILURE) and policy.max_restarts > 0
    elsewhere = (
        _env_check_failed_elsewhere_just_before(job, attempt, failed_run.host_id)
        if verdict.failure_class == c.ENV_CHECK_FAILED
        else ""
    )
    if elsewhere:
        # The same job's checks failed on two hosts in a row: the job's own doing (its image,
        # flavor or mounts), not two faulty hosts. It ends, and isolates no more hosts.
        isolate = False
        decision = Decision(
            False,
            "",
            f"the environment checks failed on {elsewhere} and then on {failed_run.host.name}: two hosts in a "
            "row point at the job's own settings (image, flavor, mounts); no further host is isolated",
            counters,
        )
    else:
        decision = decide(policy, counters, verdict.failure_class, stable=stable, multi_instance=job.node_count > 1)
        decision = _escalate(attempt, decision, verdict.failure_class, stable)
    after = decision.counters
    TrainingJob.objects.filter(id=job.id).update(
        restarts_used=after.restarts_used,
        hang_restarts_used=after.hang_restarts_used,
        consecutive_unconditional=after.consecutive_unconditional,
        consecutive_hang=after.consecutive_hang,
        reschedules_used=after.reschedules_used,
    )
    if verdict.failure_class == c.ENV_CHECK_FAILED and policy.max_restarts > 0:
        events.record(
            job,
            EventKind.ENV_CHECK_FAILED,
            f"Environment check failed on {failed_run.host.name}: {' '.join(verdict.matched_lines)}",
            host=failed_run.host.name,
            lines=verdict.matched_lines,
        )
    if isolate:
        isolate_host(failed_run.host_id, f"{verdict.explanation} ({job.name}, attempt {attempt.number})", job)
    next_attempt = None
    if decision.restart:
        next_attempt, waiting = _restart(job, attempt, decision, failed_run)
        reason = f"{verdict.failure_class}: {decision.summary}"
        if waiting:
            reason += f". {waiting}"
        TrainingJob.objects.filter(id=job.id).update(
            phase=Phase.PENDING if waiting else Phase.RESTARTING, phase_reason=reason
        )
        announce(job.id)
    else:
        exit_text = f" (exit code {failed_run.exit_code})" if failed_run.exit_code is not None else ""
        detail = failed_run.error or verdict.explanation
        finish(job, Phase.FAILED, f"{verdict.failure_class}{exit_text}: {detail} Decision: {decision.summary}.")
    if policy.max_restarts > 0:
        record_evidence = dict(failed_run.evidence, host=failed_run.host.name, host_id=failed_run.host_id)
        lost = failure.work_lost
        if lost is not None:
            record_evidence["work_lost_steps"] = lost.steps
            if lost.since_ns and failed_run.ended_at:
                # Training time to do again: from the checkpoint to the failure (a hang's idle
                # window included), what goodput counts beside the downtime.
                seconds = failed_run.ended_at.timestamp() - lost.since_ns / 1e9
                record_evidence["work_lost_s"] = round(max(0.0, seconds), 3)
        RecoveryRecord.from_decision(
            job=job,
            attempt=attempt,
            decision=decision,
            max_restarts=policy.max_restarts,
            failure_class=verdict.failure_class,
            rule=verdict.rule,
            explanation=failed_run.error or verdict.explanation,
            detected_at=failed_run.ended_at,
            failed_run=failed_run,
            matched_lines=verdict.matched_lines,
            evidence=record_evidence,
            next_attempt=next_attempt,
        ).save()
    return decision


def _escalate(attempt: Attempt, decision: Decision, failure_class: str, stable: bool) -> Decision:
    """policy.escalate with what it needs from the database: whether every container of the
    attempt is still alive (an instance ended in place keeps its container)."""
    all_alive = not (
        attempt.task_runs.exclude(state__in=[TaskRun.State.RUNNING, TaskRun.State.CREATED])
        .filter(ended_in_place=False)
        .exists()
    )
    return escalate(decision, failure_class, previous_level=attempt.level, stable=stable, all_alive=all_alive)


def _restart(job: TrainingJob, attempt: Attempt, decision: Decision, failed_run: TaskRun) -> tuple[Attempt | None, str]:
    runs = list(attempt.task_runs.select_related("host").order_by("index"))
    if decision.level == "process":
        return new_attempt(job, [r.host for r in runs], "process", reuse={r.index: r for r in runs}), ""
    if decision.level == "container":
        return new_attempt(job, [r.host for r in runs], "container"), ""
    if decision.level == "reschedule":
        # Only the lost instance moves; the others restart in their containers.
        replacement = pick_hosts(job, 1, for_recovery=True, avoid={failed_run.host_id})
        if replacement is not None:
            hosts = [replacement[0] if r.index == failed_run.index else r.host for r in runs]
            alive = {r.index: r for r in runs if r.index != failed_run.index and r.state != TaskRun.State.LOST}
            moved = new_attempt(job, hosts, "reschedule", reuse=alive)
            events.record(
                job,
                EventKind.RESCHEDULED,
                f"worker-{failed_run.index} moved from {failed_run.host.name} to {replacement[0].name}.",
                task=failed_run.task_name,
                from_host=failed_run.host.name,
                to_host=replacement[0].name,
            )
            return moved, ""
    placed = placement.place_job(job, for_recovery=True)
    if placed.hosts is None:
        return None, placed.reason  # schedule_job starts it once a host is healthy (or free) again
    return new_attempt(job, placed.hosts, "job"), ""
