"""The training job: what the user asked for (SPEC §3) and where it stands."""

from __future__ import annotations

from django.core.validators import MaxLengthValidator
from django.db import models
from django.utils import timezone
from django.utils.text import capfirst
from django.utils.translation import gettext_lazy as _

from jobs import validators as v

from .catalogue import Model, ModelVersion
from .rules import MASK, JobRules, _Errors  # noqa: F401

# Django lists a model's fields in the order they were created (the admin's read-only view and
# the wizard's defaults walk them in that order), and a mixin's fields are created when its module
# is first imported: these imports keep the order of the wizard's steps, the order the fields had
# when they were all declared here, so isort must not sort them.
# isort: off
from .job_spec import JobSpecFields
from .job_publish import JobPublishFields
from .job_ha import JobHAFields
from .job_observe import JobObserveFields
from .job_settings import JobSettingsFields
# isort: on


class Phase(models.TextChoices):
    # The values are the API's (ModelArts v2); the labels are what a page shows, in its language.
    CREATING = "Creating", _("Creating")
    PENDING = "Pending", _("Pending")
    RUNNING = "Running", _("Running")
    RESTARTING = "Restarting", _("Restarting")
    COMPLETED = "Completed", _("Completed")
    FAILED = "Failed", _("Failed")
    ABNORMAL = "Abnormal", _("Abnormal")
    TERMINATING = "Terminating", _("Terminating")
    TERMINATED = "Terminated", _("Terminated")
    # A job with retention keeps its containers for retention_hours after it ends (SPEC §3 "retention").
    COMPLETED_RETAINED = "CompletedRetained", _("Completed (retained)")
    FAILED_RETAINED = "FailedRetained", _("Failed (retained)")


FINAL_PHASES = {Phase.COMPLETED, Phase.FAILED, Phase.TERMINATED}
RETAINED_PHASES = {Phase.COMPLETED_RETAINED, Phase.FAILED_RETAINED}


class TrainingJob(
    JobRules,
    JobSpecFields,
    JobPublishFields,
    JobHAFields,
    JobObserveFields,
    JobSettingsFields,
    models.Model,
):
    """A training job and every setting of the create wizard (SPEC §3).

    `clean()` is the one validation path: the form (ModelForm) and the API (which builds a
    TrainingJob and calls full_clean()) both end here, so both refuse the same values with
    the same messages. Toggles keep the values of their sub-fields when off; only what a
    toggle turns on is validated and used.

    The settings the user chose are declared in the mixins, one per step of the wizard
    (job_spec, job_publish, job_ha, job_observe, job_settings); what the console writes as
    the job runs is declared here.
    """

    # Desired state, written by users; the supervisor converges to it.
    terminate_requested = models.BooleanField(default=False)
    terminate_requested_at = models.DateTimeField(null=True, blank=True)

    # Actual state, written by the supervisor.
    phase = models.CharField(max_length=32, choices=Phase.choices, default=Phase.CREATING)
    phase_reason = models.TextField(blank=True)
    restarts_used = models.PositiveIntegerField(default=0)
    hang_restarts_used = models.PositiveIntegerField(default=0)
    reschedules_used = models.PositiveIntegerField(default=0)
    consecutive_unconditional = models.PositiveIntegerField(default=0)
    consecutive_hang = models.PositiveIntegerField(default=0)

    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    ended_at = models.DateTimeField(null=True, blank=True)

    # What happens to the job's outputs once it ended (jobs/runtime/outputs.py), each step once.
    publish_checked_at = models.DateTimeField(
        null=True, blank=True, help_text="When auto-publish ran (whether or not it published)."
    )
    published_version = models.ForeignKey(
        ModelVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
        help_text="The model version auto-publish created.",
    )  # fmt: skip
    publish_note = models.TextField(blank=True, help_text="Why auto-publish published nothing.")
    logs_exported_at = models.DateTimeField(
        null=True, blank=True, help_text="When the logs were exported to the log path (or the export gave up)."
    )
    logs_export_error = models.TextField(blank=True, help_text="Why the export failed; the logs stay here.")
    logs_deleted_at = models.DateTimeField(
        null=True, blank=True, help_text="When retention deleted the logs (keep logs permanently off)."
    )
    resources_released_at = models.DateTimeField(
        null=True, blank=True, help_text="When the ended job's volumes and code copies were removed from its hosts."
    )

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

    @property
    def dedicated(self) -> bool:
        return self.pool_type == self.PoolType.DEDICATED

    # -- what the runtime and the pages read ---------------------------------------------------------------
    @property
    def notify_email_list(self) -> list[str]:
        return [e.strip() for e in (self.notify_emails or "").split(",") if e.strip()]

    def duration(self):
        if not self.started_at:
            return None
        return (self.ended_at or timezone.now()) - self.started_at

    def environments_masked(self) -> list[dict]:
        """The env vars as pages and the API show them: sensitive values are "******"."""
        return [
            {**env, "value": MASK if env.get("sensitive") else env.get("value", "")}
            for env in self.environments or []
            if isinstance(env, dict)
        ]

    def environment_dict(self) -> dict[str, str]:
        """The user's env vars for the container (unmasked): name -> value."""
        return {e["name"]: str(e.get("value", "")) for e in self.environments or [] if isinstance(e, dict)}

    def resource_limits(self) -> dict | None:
        """cpus, memory_mb and gpus of each instance: the custom spec or the flavor; None: unlimited."""
        if self.dedicated and self.spec_type == self.SpecType.CUSTOM and self.custom_cpus:
            return {
                "cpus": self.custom_cpus,
                "memory_mb": int((self.custom_memory_gb or 0) * 1024),
                "gpus": self.custom_gpus or 0,
            }
        if self.flavor_id:
            return {"cpus": self.flavor.cpus, "memory_mb": self.flavor.memory_mb, "gpus": self.flavor.gpus}
        return None

    @property
    def code_folder(self) -> str:
        """The last folder of the code dir: the code appears at ${MA_JOB_DIR}/<folder> (SPEC §8)."""
        parsed = v.parse_obs_dir(self.code_dir or "")
        if not parsed:
            return ""
        bucket, key = parsed
        return key.rstrip("/").rsplit("/", 1)[-1] if key else bucket

    def runtime_layout(self) -> list:
        """The runtime environment preview (SPEC §3): what the job will see where, before it is
        submitted; the same entries the containers are created from (jobs/runtime/layout.py)."""
        from jobs.runtime.layout import runtime_layout

        return runtime_layout(self)

    @property
    def publish_version(self) -> str:
        """The version auto-publish will create: V1 for a new model, previous + 1 otherwise."""
        if self.publish_as == self.PublishAs.VERSION and self.publish_model_id:
            return f"V{self.publish_model.next_version_number()}"
        return "V1"

    def publish_final_model(self) -> ModelVersion:
        """Publish the job's artifacts as a model asset version (auto-publish at completion, or by hand)."""
        from django.db import transaction

        with transaction.atomic():
            if self.publish_as == self.PublishAs.VERSION and self.publish_model_id:
                model = Model.objects.select_for_update().get(id=self.publish_model_id)
            else:
                model, _ = Model.objects.get_or_create(
                    owner_id=self.created_by_id,
                    name=self.model_name,
                    defaults={
                        "type": self.model_type or Model.Type.OTHER,
                        "brand": self.model_brand,
                        "description": self.model_description,
                    },
                )
                model = Model.objects.select_for_update().get(id=model.id)
            return ModelVersion.objects.create(
                model=model,
                number=model.next_version_number(),
                description=self.version_description,
                job=self,
                artifact_path=self.artifact_path,
            )


def _name_the_field_in_length_messages(model) -> None:
    """Django's max_length message does not say which field it is about; ours do.

    The field is named after its attribute (as before fields had verbose names), not its
    lazily translated label: the messages stay exactly what the API has always said."""
    for f in model._meta.fields:
        for validator in f.validators:
            if isinstance(validator, MaxLengthValidator):
                name = capfirst(f.name.replace("_", " "))
                validator.message = f"{name} may have at most %(limit_value)d characters (it has %(show_value)d)."


_name_the_field_in_length_messages(TrainingJob)

# Datasets appear read-only under this folder, one sub-folder per dataset in the job's order.
DATA_MOUNT_ROOT = "/home/ma-user/modelarts/inputs"
