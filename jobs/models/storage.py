"""Who owns object storage: one row per bucket (docs/decisions.md "Workspaces own their storage").

A bucket is a folder of the storage root (jobs/storage.py); the row says which workspace owns
it and which other workspaces an operator granted it to. A folder without a row belongs to
nobody: no user's browser, picker or job reaches it until an operator registers it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.core.validators import RegexValidator
from django.db import models
from django.utils.translation import gettext as _

from jobs import storage
from jobs import validators as v

from .catalogue import Workspace

if TYPE_CHECKING:
    from .rules import _Errors

BUCKET_NAME_RULE = "A bucket name: 3-63 characters of a-z 0-9 . -, starting and ending with a letter or digit."


class Bucket(models.Model):
    """An object storage bucket (`obs://<name>/`), owned by a workspace, granted to others."""

    name = models.CharField(
        max_length=63,
        unique=True,
        validators=[RegexValidator(rf"^{v.OBS_BUCKET}$", BUCKET_NAME_RULE)],
        help_text="The bucket's folder in the object storage root: obs://<name>/.",
    )
    workspace = models.ForeignKey(
        Workspace,
        on_delete=models.CASCADE,
        related_name="buckets",
        help_text="The owner: its members browse and edit the bucket, its jobs read and write it.",
    )
    granted_to = models.ManyToManyField(
        Workspace,
        blank=True,
        related_name="granted_buckets",
        help_text="Other workspaces that may use the bucket as their own (browser, picker, jobs).",
    )
    description = models.CharField(max_length=256, blank=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class BucketRules:
    """TrainingJob's rules for its obs:// fields (a mixin of rules.JobRules): the bucket must be
    owned by or granted to the job's workspace -- asked first, so that a refusal reveals nothing
    of another workspace's bucket -- then exist. The runtime asks again at use time
    (jobs/runtime/staging.py, outputs.py): a grant revoked after submission is honoured."""

    def _bucket_refusal(self, url: str, label: str) -> str:
        """'' when the job's workspace may use `url`'s bucket, else the message naming the field.
        No workspace yet: the workspace field's own error says so, and no job is saved without one."""
        if self.workspace_id is None:
            return ""
        return storage.tenancy_error(url, self.workspace_id, label)

    def _check_bucket(self, errors: _Errors, field: str, label: str) -> None:
        url = getattr(self, field)
        if not (url and v.parse_obs_dir(url)):
            return
        if message := self._bucket_refusal(url, label):
            errors.add(field, message)
        elif not storage.bucket_exists(url):
            message = _("%(label)s: bucket '%(bucket)s' does not exist in object storage.")
            errors.add(field, message % {"label": label, "bucket": storage.bucket_of(url)})

    def _clean_obs_mounts(self, errors: _Errors) -> None:
        mounts = self.obs_mounts
        if not isinstance(mounts, list):
            errors.add("obs_mounts", _("Object storage mounts must be a list."))
            return
        if len(mounts) > v.OBS_MOUNTS_MAX:
            message = _("Object storage mounts: at most %(max)s is allowed; got %(count)s.")
            errors.add("obs_mounts", message % {"max": v.OBS_MOUNTS_MAX, "count": len(mounts)})
            return
        for mount in mounts:
            if not isinstance(mount, dict) or set(mount) - {"obs_url", "mount_path"}:
                errors.add(
                    "obs_mounts", _('An object storage mount must be an object with "obs_url" and "mount_path".')
                )
                continue
            url = mount.get("obs_url") or ""
            if v.parse_obs_dir(url) is None:
                message = _("Object storage mount: the storage path must be %(rule)s; got '%(url)s'.")
                errors.add("obs_mounts", message % {"rule": v.OBS_DIR_RULE, "url": url})
            elif message := self._bucket_refusal(url, _("Object storage mount")):
                errors.add("obs_mounts", message)
            elif not storage.exists(url):
                message = _("Object storage mount: '%(url)s' does not exist in object storage.")
                errors.add("obs_mounts", message % {"url": url})
            mount_label = _("Object storage mount: the mount path")
            if message := v.mount_path_error(mount.get("mount_path") or "", mount_label):
                errors.add("obs_mounts", message)
