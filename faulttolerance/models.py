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

    @property
    def downtime(self):
        if self.running_again_at is None:
            return None
        return self.running_again_at - self.detected_at
