"""Attempts of a job and the containers (task runs) of each attempt."""

from __future__ import annotations

from django.db import models
from django.utils import timezone

from .catalogue import DockerHost
from .job import TrainingJob


class Attempt(models.Model):
    """One run of all instances of a job; every restart makes a new attempt."""

    class State(models.TextChoices):
        STARTING = "starting"
        RUNNING = "running"
        ENDED = "ended"

    class Outcome(models.TextChoices):
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        TERMINATED = "terminated"
        PREEMPTED = "preempted"

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    level = models.CharField(max_length=16, default="initial", help_text="How this attempt was started.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.STARTING)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    # Set once, with a conditional UPDATE, by the scheduler that stops this attempt to make
    # room for a higher-priority job (SPEC §3 "preemptible"): its end is then "preempted".
    preempted_at = models.DateTimeField(null=True, blank=True)
    preempted_by = models.ForeignKey(
        TrainingJob,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="preemptions",
        help_text="The job that needed the room.",
    )

    class Meta:
        ordering = ["job", "number"]
        constraints = [models.UniqueConstraint(fields=["job", "number"], name="unique_attempt_number")]

    def __str__(self) -> str:
        return f"{self.job.name} attempt {self.number}"


class TaskRun(models.Model):
    """One instance (container) of one attempt, and the index of its log file."""

    class State(models.TextChoices):
        CREATED = "created"
        RUNNING = "running"
        EXITED = "exited"
        START_FAILED = "start_failed"
        LOST = "lost"

    attempt = models.ForeignKey(Attempt, on_delete=models.CASCADE, related_name="task_runs")
    index = models.PositiveIntegerField()
    host = models.ForeignKey(DockerHost, on_delete=models.PROTECT, related_name="task_runs")
    container_name = models.CharField(max_length=128)
    reuses_container = models.BooleanField(
        default=False, help_text="A process-level restart inside the previous attempt's container."
    )
    container_id = models.CharField(max_length=64, blank=True)
    state = models.CharField(max_length=16, choices=State.choices, default=State.CREATED)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)
    exit_code = models.IntegerField(null=True, blank=True)
    oom_killed = models.BooleanField(default=False)
    error = models.TextField(blank=True, help_text="Why it could not start or was lost.")
    hang_suspected_at = models.DateTimeField(null=True, blank=True)
    hung = models.BooleanField(default=False, help_text="Ended by hang detection.")
    ended_in_place = models.BooleanField(
        default=False, help_text="The user's process ended; its container was still alive."
    )
    evidence = models.JSONField(default=dict, blank=True, help_text="Hang metrics, captured stacks.")

    # Log index: the file holds exactly log_bytes bytes / log_lines lines that
    # are acknowledged; anything past log_bytes is discarded on resume.
    # 64-bit: a job that prints more than 2^31 lines (36 minutes at a million a second) had its
    # follower's acknowledgement refused by the column, on every try, for the rest of its life.
    log_lines = models.PositiveBigIntegerField(default=0)
    log_bytes = models.PositiveBigIntegerField(default=0)
    log_last_ts_ns = models.BigIntegerField(default=0)
    log_last_ts_count = models.PositiveBigIntegerField(default=0, help_text="Lines persisted with log_last_ts_ns.")

    # Reconcile's stop of an instance that outlived its attempt (its stop was lost): when it was
    # last asked, so that it is asked again only after a while (reconcile.py).
    outlived_stop_asked_at = models.DateTimeField(null=True, blank=True)

    # Which worker follows the container; claimed with a conditional update.
    follower_token = models.UUIDField(null=True, blank=True)
    follower_heartbeat = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["attempt", "index"]
        constraints = [models.UniqueConstraint(fields=["attempt", "index"], name="unique_task_index")]

    def __str__(self) -> str:
        return self.container_name

    @property
    def task_name(self) -> str:
        return f"worker-{self.index}"

    @classmethod
    def later_in_its_container(cls, container_id, job_id, number) -> models.QuerySet:
        """The runs of later attempts of the job restarted in this container (process level, or
        the instances a reschedule kept) that took it over, or still may: not one whose attempt
        ended before it ran (still "created": stopped while it started; "start failed": the
        restart's call to the launcher failed), which leaves the container to the run before.
        Values, or OuterRef()s for a subquery."""
        return cls.objects.filter(
            container_id=container_id, attempt__job_id=job_id, attempt__number__gt=number
        ).exclude(attempt__state=Attempt.State.ENDED, state__in=[cls.State.CREATED, cls.State.START_FAILED])

    @classmethod
    def drainable(cls) -> models.Q:
        """Runs whose rest of the log a drain takes once their follower died: the container ended,
        or the run never took its container for good (a restart in it whose attempt ended while it
        was "created" or its start failed) after a follower was handed over to it."""
        never_took_it = models.Q(
            state__in=[cls.State.CREATED, cls.State.START_FAILED], attempt__state=Attempt.State.ENDED
        )
        return models.Q(state=cls.State.EXITED) | never_took_it

    @classmethod
    def outliving_their_attempt(cls) -> models.QuerySet:
        """Instances whose container should have stopped: their attempt ended, yet the run is
        still running, or still followed (ended in place: its process ended or hung and the
        container waits; a restart in it reported failed), and no later attempt took the
        container over. The decision stops them right after it commits; what is left here a
        while later, its stop was lost."""
        took_over = cls.later_in_its_container(
            models.OuterRef("container_id"), models.OuterRef("attempt__job_id"), models.OuterRef("attempt__number")
        )
        return (
            cls.objects.filter(attempt__state=Attempt.State.ENDED)
            .filter(models.Q(state=cls.State.RUNNING) | models.Q(follower_token__isnull=False))
            .exclude(models.Exists(took_over))
        )
