"""Jobs, their attempts and the containers (task runs) of each attempt.

The database is the source of truth: the supervisor reads desired state from
here and writes what Docker reports back here; websockets only announce that
a row changed.
"""

from __future__ import annotations

import uuid

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from . import validators as v


def new_project_id() -> str:
    return uuid.uuid4().hex


class Workspace(models.Model):
    """A team's space; jobs live in one. Its project_id is the API's {project_id}."""

    name = models.CharField(max_length=64, unique=True)
    project_id = models.CharField(max_length=32, unique=True, default=new_project_id, editable=False)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="workspaces", blank=True)

    def __str__(self) -> str:
        return self.name


class ResourcePool(models.Model):
    """A set of Docker hosts and the environment-check thresholds that apply on it (SPEC §5)."""

    class Kind(models.TextChoices):
        PUBLIC = "public"
        DEDICATED = "dedicated"

    name = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PUBLIC)
    check_root_gb = models.FloatField(default=32, help_text="disk-size root: free space of / must exceed this.")
    check_shm_gb = models.FloatField(default=1, help_text="disk-size shm: /dev/shm must exceed this.")
    check_cache_gb = models.FloatField(default=32, help_text="disk-size cache: free space of /cache must exceed this.")
    check_ulimit_memlock = models.PositiveBigIntegerField(default=16000)
    check_ulimit_nofile = models.PositiveBigIntegerField(default=1000000)
    check_ulimit_stack = models.PositiveBigIntegerField(default=8000)
    check_ulimit_nproc = models.PositiveBigIntegerField(default=1000000)
    shm_size_gb = models.FloatField(default=2, help_text="/dev/shm of each container (Docker's default is 64 MB).")

    def __str__(self) -> str:
        return self.name


class Flavor(models.Model):
    """An instance size (SPEC §2): what each container of a job may use."""

    name = models.CharField(max_length=64, unique=True, help_text="e.g. cpu.4u8g or GPU:1*tnt004")
    cpus = models.FloatField(default=1)
    memory_mb = models.PositiveIntegerField(default=4096)
    gpus = models.PositiveIntegerField(default=0)
    gpu_type = models.CharField(max_length=64, blank=True)
    shm_size_gb = models.FloatField(null=True, blank=True, help_text="Empty: the pool's shm size.")
    uses_ib = models.BooleanField(default=False, help_text="InfiniBand: the ulimit check runs.")
    single_process = models.BooleanField(default=False, help_text="Refuses multi-process (distributed) jobs.")

    def __str__(self) -> str:
        return self.name


class DockerHost(models.Model):
    """A Docker Engine that runs job containers, registered by an operator."""

    name = models.CharField(max_length=64, unique=True)
    base_url = models.CharField(max_length=255, help_text="e.g. unix:///var/run/docker.sock")
    pool = models.ForeignKey(ResourcePool, null=True, blank=True, on_delete=models.SET_NULL, related_name="hosts")
    address = models.CharField(
        max_length=64, default="127.0.0.1", help_text="Where instances on other hosts reach this host."
    )
    enabled = models.BooleanField(default=True)
    hot_standby = models.BooleanField(default=False, help_text="Used only to recover jobs, never for new ones.")
    isolated = models.BooleanField(default=False, help_text="Gets no new instances until an operator clears it.")
    isolation_reason = models.TextField(blank=True)
    isolated_at = models.DateTimeField(null=True, blank=True)
    last_seen_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return self.name


class PresetImage(models.Model):
    """An operator-registered image users can pick in the wizard."""

    name = models.CharField(max_length=64, unique=True)
    image_ref = models.CharField(max_length=255, validators=[v.image_reference_validator])
    description = models.CharField(max_length=256, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.image_ref})"


class Phase(models.TextChoices):
    CREATING = "Creating"
    PENDING = "Pending"
    RUNNING = "Running"
    RESTARTING = "Restarting"
    COMPLETED = "Completed"
    FAILED = "Failed"
    ABNORMAL = "Abnormal"
    TERMINATING = "Terminating"
    TERMINATED = "Terminated"


FINAL_PHASES = {Phase.COMPLETED, Phase.FAILED, Phase.TERMINATED}


class TrainingJob(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    workspace = models.ForeignKey(Workspace, on_delete=models.CASCADE, related_name="jobs")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.PROTECT, related_name="jobs")
    name = models.CharField(max_length=64, validators=[v.job_name_validator])
    description = models.CharField(max_length=256, blank=True)
    image = models.CharField(max_length=255, validators=[v.image_reference_validator])
    command = models.TextField()
    node_count = models.PositiveIntegerField(default=1)
    flavor = models.ForeignKey(Flavor, null=True, blank=True, on_delete=models.PROTECT, related_name="jobs")

    # High availability (SPEC §4). R is max_restarts when fault tolerance is on, else 0.
    fault_tolerance = models.BooleanField(default=False)
    max_restarts = models.PositiveIntegerField(default=3)
    unconditional_restart = models.BooleanField(default=False)
    hang_restart = models.BooleanField(default=False)
    pod_retry_num = models.PositiveIntegerField(default=0, help_text="Instance rescheduling count P (0-128).")

    # Hang detection window (SPEC §6); 0 uses the platform default.
    hang_window_s = models.PositiveIntegerField(default=0)

    # Notifications (SPEC §3 "more settings"): a topic and the events sent to it.
    notify_webhook_url = models.URLField(blank=True, max_length=500)
    notify_emails = models.CharField(blank=True, max_length=500, help_text="Comma-separated e-mail addresses.")
    notify_events = models.JSONField(default=list, blank=True)

    class Visibility(models.TextChoices):
        WORKSPACE = "workspace", "Workspace members"
        CREATOR = "creator", "Only the creator"

    visibility = models.CharField(max_length=16, choices=Visibility.choices, default=Visibility.WORKSPACE)

    # Desired state, written by users; the supervisor converges to it.
    terminate_requested = models.BooleanField(default=False)
    terminate_requested_at = models.DateTimeField(null=True, blank=True)

    # Actual state, written by the supervisor.
    phase = models.CharField(max_length=16, choices=Phase.choices, default=Phase.CREATING)
    phase_reason = models.TextField(blank=True)
    restarts_used = models.PositiveIntegerField(default=0)
    hang_restarts_used = models.PositiveIntegerField(default=0)
    reschedules_used = models.PositiveIntegerField(default=0)
    consecutive_unconditional = models.PositiveIntegerField(default=0)
    consecutive_hang = models.PositiveIntegerField(default=0)

    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["workspace", "-created_at"]), models.Index(fields=["phase"])]
        permissions = [
            ("list_all_jobs", "May list all jobs (including creator-only ones)"),
            ("use_high_priority", "May use high priority (3)"),
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def max_restarts_effective(self) -> int:
        """R of SPEC §4: 0 means fault tolerance off."""
        return self.max_restarts if self.fault_tolerance else 0

    @property
    def is_final(self) -> bool:
        return self.phase in FINAL_PHASES

    def clean(self) -> None:
        """The single validation path: the form and the API both call full_clean()."""
        errors: dict[str, str] = {}
        if not (self.command or "").strip():
            errors["command"] = "Start command is required."
        if self.node_count is None or not (v.NODE_COUNT_MIN <= self.node_count <= v.NODE_COUNT_MAX):
            errors["node_count"] = f"Instance count must be between {v.NODE_COUNT_MIN} and {v.NODE_COUNT_MAX}."
        if self.fault_tolerance and (
            self.max_restarts is None or not (v.MAX_RESTARTS_MIN <= self.max_restarts <= v.MAX_RESTARTS_MAX)
        ):
            errors["max_restarts"] = (
                f"Max restarts must be between {v.MAX_RESTARTS_MIN} and {v.MAX_RESTARTS_MAX} "
                "when fault tolerance is on."
            )
        if self.pod_retry_num is not None and self.pod_retry_num > v.POD_RETRY_MAX:
            errors["pod_retry_num"] = f"Instance rescheduling count must be between 0 and {v.POD_RETRY_MAX}."
        if not self.fault_tolerance and (self.unconditional_restart or self.hang_restart or self.pod_retry_num):
            errors["fault_tolerance"] = (
                "Unconditional restart, hang restart and instance rescheduling need fault tolerance on."
            )
        emails = [e.strip() for e in (self.notify_emails or "").split(",") if e.strip()]
        bad = [e for e in emails if not v.EMAIL_RE.match(e)]
        if bad:
            errors["notify_emails"] = f"Not an e-mail address: {', '.join(bad)}."
        unknown = set(self.notify_events or []) - {str(kind) for kind in NOTIFIABLE_EVENTS}
        if unknown:
            errors["notify_events"] = f"Unknown notification events: {', '.join(sorted(unknown))}."
        elif self.notify_events and not (self.notify_webhook_url or emails):
            errors["notify_events"] = "Choose a topic (webhook URL or e-mail addresses) for the notifications."
        if errors:
            raise ValidationError(errors)

    @property
    def notify_email_list(self) -> list[str]:
        return [e.strip() for e in (self.notify_emails or "").split(",") if e.strip()]

    def duration(self):
        if not self.started_at:
            return None
        return (self.ended_at or timezone.now()) - self.started_at


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

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="attempts")
    number = models.PositiveIntegerField()
    level = models.CharField(max_length=16, default="initial", help_text="How this attempt was started.")
    state = models.CharField(max_length=16, choices=State.choices, default=State.STARTING)
    outcome = models.CharField(max_length=16, choices=Outcome.choices, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

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
    log_lines = models.PositiveIntegerField(default=0)
    log_bytes = models.PositiveBigIntegerField(default=0)
    log_last_ts_ns = models.BigIntegerField(default=0)
    log_last_ts_count = models.PositiveIntegerField(default=0, help_text="Lines persisted with log_last_ts_ns.")

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


class EventKind(models.TextChoices):
    STARTED = "started"
    COMPLETED = "completed"
    FAILED = "failed"
    TERMINATED = "terminated"
    SUSPECTED_HANG = "suspected_hang", "suspected hang"
    RESTARTED = "restarted"
    PREEMPTED = "preempted"
    RESCHEDULED = "rescheduled"
    HOST_ISOLATED = "host_isolated", "host isolated"
    ENV_CHECK_FAILED = "env_check_failed", "environment check failed"


# Events a user may subscribe a notification topic to (SPEC §3 "notifications").
NOTIFIABLE_EVENTS = [
    EventKind.STARTED,
    EventKind.COMPLETED,
    EventKind.FAILED,
    EventKind.TERMINATED,
    EventKind.SUSPECTED_HANG,
    EventKind.RESTARTED,
    EventKind.PREEMPTED,
]


class JobEvent(models.Model):
    """Something that happened to a job: the Events tab, and what notifications carry."""

    job = models.ForeignKey(TrainingJob, on_delete=models.CASCADE, related_name="events")
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    at = models.DateTimeField(default=timezone.now)
    message = models.TextField()
    data = models.JSONField(default=dict, blank=True)

    class Meta:
        ordering = ["-at", "-id"]
        indexes = [models.Index(fields=["job", "-at"])]

    def __str__(self) -> str:
        return f"{self.job} {self.kind}"


class Notification(models.Model):
    """One delivery of one event to one target; retried until sent or given up."""

    class Status(models.TextChoices):
        PENDING = "pending"
        SENT = "sent"
        FAILED = "failed"

    event = models.ForeignKey(JobEvent, on_delete=models.CASCADE, related_name="notifications")
    transport = models.CharField(max_length=16)  # a key of jobs.notify.TRANSPORTS
    target = models.CharField(max_length=500)
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.PENDING)
    tries = models.PositiveIntegerField(default=0)
    last_error = models.TextField(blank=True)
    sent_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["event", "transport", "target"], name="unique_notification_target")
        ]
