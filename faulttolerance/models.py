from __future__ import annotations

from django.db import models
from django.utils import timezone


class RecoveryRecord(models.Model):
    """One decision taken after a failed attempt: the Fault recovery tab's row."""

    job = models.ForeignKey("jobs.TrainingJob", on_delete=models.CASCADE, related_name="recoveries")
    failed_attempt = models.OneToOneField("jobs.Attempt", on_delete=models.CASCADE, related_name="recovery")
    detected_at = models.DateTimeField(default=timezone.now)
    failure_class = models.CharField(max_length=32)
    rule = models.CharField(max_length=64, blank=True)
    explanation = models.TextField(blank=True)
    task_index = models.PositiveIntegerField(null=True, blank=True, help_text="The instance that failed.")
    exit_code = models.IntegerField(null=True, blank=True)
    oom_killed = models.BooleanField(default=False)
    matched_lines = models.JSONField(default=list, blank=True)
    evidence = models.JSONField(default=dict, blank=True, help_text="Hang metrics, captured stacks, work lost.")
    restart = models.BooleanField()
    level = models.CharField(max_length=16, blank=True)
    decision = models.CharField(max_length=200)
    restarts_used_after = models.PositiveIntegerField()
    max_restarts = models.PositiveIntegerField()
    hang_restarts_after = models.PositiveIntegerField(default=0)
    reschedules_after = models.PositiveIntegerField(default=0)
    next_attempt = models.OneToOneField(
        "jobs.Attempt", null=True, blank=True, on_delete=models.SET_NULL, related_name="caused_by"
    )
    running_again_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-detected_at", "-id"]

    def __str__(self) -> str:
        return f"{self.job} {self.failure_class} -> {self.decision}"

    @classmethod
    def from_decision(
        cls,
        *,
        job,
        attempt,
        decision,
        max_restarts: int,
        failure_class: str,
        rule: str,
        explanation: str,
        detected_at=None,
        failed_run=None,
        matched_lines: list[str] | None = None,
        evidence: dict | None = None,
        next_attempt=None,
    ) -> RecoveryRecord:
        """The record of one decision (policy.Decision), unsaved: what failed (the run, if one
        instance did), what was decided and the counters after it."""
        after = decision.counters
        return cls(
            job=job,
            failed_attempt=attempt,
            detected_at=detected_at or timezone.now(),
            failure_class=failure_class,
            rule=rule,
            explanation=explanation,
            task_index=failed_run.index if failed_run is not None else None,
            exit_code=failed_run.exit_code if failed_run is not None else None,
            oom_killed=bool(failed_run is not None and failed_run.oom_killed),
            matched_lines=matched_lines or [],
            evidence=evidence or {},
            restart=decision.restart,
            level=decision.level,
            decision=decision.summary,
            restarts_used_after=after.restarts_used,
            max_restarts=max_restarts,
            hang_restarts_after=after.hang_restarts_used,
            reschedules_after=after.reschedules_used,
            next_attempt=next_attempt,
        )

    @property
    def downtime(self):
        if self.running_again_at is None:
            return None
        return self.running_again_at - self.detected_at
