"""Catalogue: workspaces, pools, flavors, hosts, images, templates, file systems, datasets, models, key pairs."""

from __future__ import annotations

import base64
import hashlib
import os
import re
import uuid
from typing import TYPE_CHECKING

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from jobs import validators as v

if TYPE_CHECKING:
    from .job import TrainingJob


def new_project_id() -> str:
    return uuid.uuid4().hex


class Workspace(models.Model):
    """A team's space; jobs live in one. Its project_id is the API's {project_id}."""

    name = models.CharField(max_length=64, unique=True)
    project_id = models.CharField(max_length=32, unique=True, default=new_project_id, editable=False)
    members = models.ManyToManyField(settings.AUTH_USER_MODEL, related_name="workspaces", blank=True)

    def __str__(self) -> str:
        return self.name


class ProcessorKind(models.TextChoices):
    """What an image is built for and what a flavor provides (SPEC §3 "flavor")."""

    CPU = "cpu", "CPU"
    GPU = "gpu", "GPU"
    NPU = "npu", _("NPU (Ascend)")


class ResourcePool(models.Model):
    """A set of Docker hosts and the environment-check thresholds that apply on it (SPEC §5)."""

    class Kind(models.TextChoices):
        PUBLIC = "public"
        DEDICATED = "dedicated"

    name = models.CharField(max_length=64, unique=True)
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.PUBLIC)
    # Node size (SPEC §3 "spec type"): a custom spec of a job on this pool may not exceed it.
    node_cpus = models.FloatField(default=8, help_text="CPUs of one node of this pool.")
    node_memory_gb = models.FloatField(default=32, help_text="Memory (GB) of one node of this pool.")
    node_gpus = models.PositiveIntegerField(default=0, help_text="GPUs (or NPUs) of one node of this pool.")
    check_root_gb = models.FloatField(default=32, help_text="disk-size root: free space of / must exceed this.")
    check_shm_gb = models.FloatField(default=1, help_text="disk-size shm: /dev/shm must exceed this.")
    check_cache_gb = models.FloatField(default=32, help_text="disk-size cache: free space of /cache must exceed this.")
    check_ulimit_memlock = models.PositiveBigIntegerField(default=16000)
    check_ulimit_nofile = models.PositiveBigIntegerField(default=1000000)
    check_ulimit_stack = models.PositiveBigIntegerField(default=8000)
    check_ulimit_nproc = models.PositiveBigIntegerField(default=1000000)
    shm_size_gb = models.FloatField(default=2, help_text="/dev/shm of each container (Docker's default is 64 MB).")
    # Limits of every instance of a job without a flavor or custom spec (SPEC §8: no job runs
    # unbounded on a shared host), and a PIDs limit for every container.
    default_cpus = models.FloatField(default=2, help_text="CPUs of an instance of a job without a flavor.")
    default_memory_mb = models.PositiveIntegerField(
        default=8192, help_text="Memory (MB) of an instance of a job without a flavor; no swap beyond it."
    )
    pids_limit = models.PositiveIntegerField(
        default=4096, help_text="Processes and threads of each container, any job (a fork bomb stays inside)."
    )

    def __str__(self) -> str:
        return self.name

    @property
    def node_size(self) -> str:
        gpus = f", {self.node_gpus} GPUs" if self.node_gpus else ""
        return f"{self.node_cpus:g} CPUs, {self.node_memory_gb:g} GB{gpus}"


class Flavor(models.Model):
    """An instance size (SPEC §2): what each container of a job may use."""

    name = models.CharField(max_length=64, unique=True, help_text="e.g. cpu.4u8g or GPU:1*tnt004")
    cpus = models.FloatField(default=1)
    memory_mb = models.PositiveIntegerField(default=4096)
    gpus = models.PositiveIntegerField(default=0)
    gpu_type = models.CharField(max_length=64, blank=True)
    npu = models.BooleanField(default=False, help_text="Ascend NPU flavor: 'gpus' counts its NPU cards.")
    shm_size_gb = models.FloatField(null=True, blank=True, help_text="Empty: the pool's shm size.")
    uses_ib = models.BooleanField(default=False, help_text="InfiniBand: the ulimit check runs.")
    single_process = models.BooleanField(default=False, help_text="Refuses multi-process (distributed) jobs.")

    def __str__(self) -> str:
        return self.name

    @property
    def kind(self) -> str:
        if self.npu:
            return ProcessorKind.NPU
        return ProcessorKind.GPU if self.gpus else ProcessorKind.CPU


DOCKER_URL_RULE = (
    "unix:///path/to/docker.sock (this machine), tcp://host:2376 with the three TLS files "
    "(an engine run with --tlsverify), or ssh://user@host (the workers' ssh client)"
)


class DockerHost(models.Model):
    """A Docker Engine that runs job containers, registered by an operator.

    Reached the docker SDK's own ways (README "More Docker hosts"): a local socket, TCP with
    mutual TLS, or SSH. Never plain TCP: anyone who reaches an engine's API owns its host."""

    name = models.CharField(max_length=64, unique=True)
    base_url = models.CharField(max_length=255, help_text=f"How workers reach its engine: {DOCKER_URL_RULE}.")
    tls_ca_cert = models.CharField(
        "TLS CA certificate",
        max_length=512,
        blank=True,
        help_text="tcp:// only: path (on every worker) of the CA certificate that signed the engine's.",
    )
    tls_client_cert = models.CharField(
        "TLS client certificate",
        max_length=512,
        blank=True,
        help_text="tcp:// only: path (on every worker) of the console's client certificate.",
    )
    tls_client_key = models.CharField(
        "TLS client key",
        max_length=512,
        blank=True,
        help_text="tcp:// only: path (on every worker) of the client certificate's private key.",
    )
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
    # When a worker last claimed this host's orphan scan (jobs/runtime/cleanup.py): one worker
    # lists its containers every ORPHAN_SCAN_EVERY_S, not each of them at every reconcile.
    orphans_scanned_at = models.DateTimeField(null=True, blank=True, editable=False)

    def __str__(self) -> str:
        return self.name

    TLS_FIELDS = ("tls_ca_cert", "tls_client_cert", "tls_client_key")

    @property
    def uses_tls(self) -> bool:
        return self.base_url.startswith("tcp://")

    def clean(self) -> None:
        url = self.base_url or ""
        errors: dict[str, str] = {}
        scheme, _, rest = url.partition("://")
        if scheme not in ("unix", "tcp", "ssh") or not rest:
            errors["base_url"] = f"The engine's URL must be {DOCKER_URL_RULE}; got '{url}'."
        elif scheme == "unix" and not rest.startswith("/"):
            errors["base_url"] = f"A unix socket URL names an absolute path: unix:///...; got '{url}'."
        elif scheme == "tcp":
            for field in self.TLS_FIELDS:
                path = getattr(self, field)
                label = self._meta.get_field(field).verbose_name
                if not path:
                    errors[field] = (
                        f"{label} is required for tcp://: the console never talks to an engine's "
                        "API over plain TCP (anyone who reaches it owns the host)."
                    )
                elif not os.path.isabs(path) or not os.path.isfile(path):
                    errors[field] = f"{label}: no file at '{path}' on this machine (an absolute path)."
        if scheme != "tcp":
            for field in self.TLS_FIELDS:
                if getattr(self, field):
                    label = self._meta.get_field(field).verbose_name
                    errors[field] = f"{label} is for tcp:// engines only; leave it empty for {scheme}://."
        if errors:
            raise ValidationError(errors)


class PresetImage(models.Model):
    """An operator-registered image users can pick in the wizard."""

    name = models.CharField(max_length=64, unique=True)
    image_ref = models.CharField(max_length=255, validators=[v.image_reference_validator])
    kind = models.CharField(
        max_length=8,
        choices=ProcessorKind.choices,
        default=ProcessorKind.CPU,
        help_text="On the public pool the flavor must be of the same kind.",
    )
    description = models.CharField(max_length=256, blank=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.image_ref})"


class PresetTemplate(models.Model):
    """A ready-made job (SPEC §3 "preset template"): choosing one fills the training fields."""

    class Type(models.TextChoices):
        TEXT_GENERATION = "text_generation", _("Text generation")
        IMAGE_UNDERSTANDING = "image_understanding", _("Image understanding")

    name = models.CharField(max_length=64, unique=True)
    type = models.CharField(max_length=32, choices=Type.choices, default=Type.TEXT_GENERATION)
    brand = models.CharField(max_length=64, blank=True, help_text="e.g. Qwen")
    description = models.CharField(max_length=256, blank=True, validators=[v.validate_description])
    image = models.ForeignKey(PresetImage, null=True, blank=True, on_delete=models.PROTECT, related_name="templates")
    command = models.TextField(blank=True)
    code_dir = models.CharField(max_length=1024, blank=True, validators=[v.obs_dir_validator(_("Code dir"))])
    local_code_dir = models.CharField(max_length=1024, blank=True, validators=[v.validate_local_code_dir])
    environments = models.JSONField(default=list, blank=True, help_text='[{"name": ..., "value": ...}]')

    class Meta:
        ordering = ["type", "brand", "name"]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        from .rules import environment_errors

        if messages := environment_errors(self.environments):
            raise ValidationError({"environments": messages})

    def apply_template(self, job: TrainingJob, *, overwrite: bool = True) -> TrainingJob:
        """Fill `job`'s description, image, command, code dir, local code dir and env vars
        from this template. With overwrite=False only empty (or default) fields are filled
        and only env vars the job does not have are added (the API: the body wins)."""
        job.preset_template = self

        def fill(field: str, value, default="") -> None:
            if value in ("", None):
                return
            if overwrite or getattr(job, field) in ("", None, default):
                setattr(job, field, value)

        fill("description", self.description)
        if self.image_id and (overwrite or not (job.image or job.preset_image_id)):
            from .job import TrainingJob

            job.image_source = TrainingJob.ImageSource.PRESET
            job.preset_image = self.image
            job.image = self.image.image_ref
            job.image_kind = self.image.kind
        fill("command", self.command)
        fill("code_dir", self.code_dir)
        fill("local_code_dir", self.local_code_dir, default=v.DEFAULT_LOCAL_CODE_DIR)
        ours = [dict(e) for e in self.environments or [] if isinstance(e, dict)]
        theirs = [e for e in job.environments or [] if isinstance(e, dict)]
        if overwrite:
            names = {e.get("name") for e in ours}
            job.environments = ours + [e for e in theirs if e.get("name") not in names]
        else:
            names = {e.get("name") for e in theirs}
            job.environments = theirs + [e for e in ours if e.get("name") not in names]
        for env in job.environments:
            env.setdefault("sensitive", False)
        return job


class FileSystem(models.Model):
    """A shared file system an operator registers (SFS Turbo in the seeds): an NFS export or a
    directory present on every Docker host. Jobs on dedicated pools mount it -- jobs of the
    workspaces an operator granted it to, no other (docs/decisions.md "Workspaces own their storage")."""

    class Kind(models.TextChoices):
        NFS = "nfs", "NFS export"
        HOST_DIR = "host_dir", "Host directory"

    name = models.CharField(max_length=64, unique=True, validators=[v.job_name_validator])
    kind = models.CharField(max_length=16, choices=Kind.choices, default=Kind.NFS)
    source = models.CharField(
        max_length=512, help_text="NFS: 'server:/export/path'; host directory: an absolute path on every host."
    )
    description = models.CharField(max_length=256, blank=True)
    workspaces = models.ManyToManyField(
        Workspace,
        blank=True,
        related_name="file_systems",
        help_text="The workspaces whose jobs may mount it (and keep TensorBoard summaries on it); none: no job.",
    )

    def __str__(self) -> str:
        return self.name

    def granted_to(self, workspace) -> bool:
        """Whether jobs of `workspace` (a Workspace, its id or None) may mount this file system."""
        workspace_id = getattr(workspace, "pk", workspace)
        return workspace_id is not None and self.workspaces.filter(pk=workspace_id).exists()

    def refusal(self, workspace, label: str) -> str:
        """'' when granted to `workspace`, else the message naming the field (`label`)."""
        if self.granted_to(workspace):
            return ""
        workspace_id = getattr(workspace, "pk", workspace)
        shown = (
            Workspace.objects.filter(pk=workspace_id).values_list("name", flat=True).first() if workspace_id else None
        )
        message = gettext("%(label)s: file system '%(name)s' is not granted to workspace '%(workspace)s'.")
        return message % {"label": label, "name": self.name, "workspace": shown or "(none)"}

    def clean(self) -> None:
        if self.kind == self.Kind.NFS and not NFS_SOURCE_RE.match(self.source or ""):
            raise ValidationError({"source": "An NFS source must be 'server:/export/path'."})
        if self.kind == self.Kind.HOST_DIR and v.normalized_path(self.source or "") in (None, "/"):
            raise ValidationError({"source": "A host directory must be an absolute path other than /."})


NFS_SOURCE_RE = re.compile(r"^[A-Za-z0-9.-]+:/[A-Za-z0-9._/-]*$")


class Dataset(models.Model):
    """Training data (SPEC §3 "datasets"): preset data (no owner, operator's) or a user's own."""

    name = models.CharField(max_length=128)
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="datasets",
        help_text="Empty: preset data, offered to everyone.",
    )
    online = models.BooleanField(default=True, help_text="Only online data can be chosen for a job.")
    path = models.CharField(max_length=1024, validators=[v.obs_dir_validator(_("Dataset path"))])
    description = models.CharField(max_length=256, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_dataset_name_per_owner")]

    def __str__(self) -> str:
        return f"{self.name} ({'preset' if self.owner_id is None else self.owner})"

    @property
    def is_preset(self) -> bool:
        return self.owner_id is None


class Model(models.Model):
    """A model asset ("my models"): what auto-publish creates or adds a version to."""

    class Type(models.TextChoices):
        TEXT_GENERATION = "text_generation", _("Text generation")
        IMAGE_UNDERSTANDING = "image_understanding", _("Image understanding")
        IMAGE_GENERATION = "image_generation", _("Image generation")
        VIDEO_GENERATION = "video_generation", _("Video generation")
        OTHER = "other", _("Other")

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="model_assets")
    name = models.CharField(max_length=128, validators=[v.validate_model_name])
    type = models.CharField(max_length=32, choices=Type.choices, default=Type.OTHER)
    brand = models.CharField(max_length=64, blank=True)
    description = models.CharField(max_length=256, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        verbose_name = "model asset"
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_model_name_per_owner")]

    def __str__(self) -> str:
        return self.name

    def next_version_number(self) -> int:
        latest = self.versions.aggregate(n=models.Max("number"))["n"] if self.pk else None
        return (latest or 0) + 1


class ModelVersion(models.Model):
    """One version of a model asset: V1 for a new model, previous + 1 after; never user-editable."""

    model = models.ForeignKey(Model, on_delete=models.CASCADE, related_name="versions")
    number = models.PositiveIntegerField(editable=False)
    description = models.CharField(max_length=v.VERSION_DESCRIPTION_MAX, blank=True)
    job = models.ForeignKey(
        "TrainingJob", null=True, blank=True, on_delete=models.SET_NULL, related_name="published_versions"
    )
    artifact_path = models.CharField(max_length=1024, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["model", "-number"]
        constraints = [models.UniqueConstraint(fields=["model", "number"], name="unique_model_version")]

    def __str__(self) -> str:
        return f"{self.model.name} {self.label}"

    @property
    def label(self) -> str:
        return f"V{self.number}"


class KeyPair(models.Model):
    """A user's SSH public key, for SSH remote development into a job's instances."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="key_pairs")
    name = models.CharField(max_length=64, validators=[v.job_name_validator])
    public_key = models.TextField(validators=[v.validate_ssh_public_key])
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["name", "id"]
        constraints = [models.UniqueConstraint(fields=["owner", "name"], name="unique_key_pair_name_per_owner")]

    def __str__(self) -> str:
        return self.name

    @property
    def fingerprint(self) -> str:
        try:
            blob = base64.b64decode(self.public_key.split()[1])
        except (IndexError, ValueError):
            return ""
        return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")
