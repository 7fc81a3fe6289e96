"""SPEC §3's rules: the one validation path of the form and the API (TrainingJob.clean()).

A mixin of TrainingJob, split out by wizard step; each _clean_* adds to one
errors dict so every refused field is reported at once. The messages are in the language of
the request that validates (the page's, or the API's Accept-Language): clean() runs in it."""

from __future__ import annotations

import re

from django.core.exceptions import ValidationError
from django.utils.translation import gettext as _

from jobs import storage
from jobs import validators as v

from .catalogue import Dataset, DockerHost, FileSystem, Model, ProcessorKind, ResourcePool
from .events import NOTIFIABLE_EVENTS
from .rules_lists import environment_errors, tag_errors
from .storage import BucketRules

__all__ = ["MASK", "JobRules", "environment_errors", "tag_errors"]


class _Errors(dict):
    def add(self, field: str, message: str) -> None:
        self.setdefault(field, []).append(message)


MASK = "******"


class JobRules(BucketRules):
    """TrainingJob's validation, one method per wizard step."""

    # -- validation: the one path of the form and the API ------------------------------------------------
    def clean(self) -> None:
        """SPEC §3, every row. Raises one ValidationError with the messages of every field."""
        errors = _Errors()
        self._clean_basic(errors)
        self._clean_training(errors)
        self._clean_resources(errors)
        self._clean_data(errors)
        self._clean_storage(errors)
        self._clean_high_availability(errors)
        self._clean_access(errors)
        self._clean_observe(errors)
        self._clean_more(errors)
        self._clean_mount_paths_unique(errors)
        self._clean_notifications(errors)
        if errors:
            raise ValidationError(dict(errors))

    def _clean_basic(self, errors: _Errors) -> None:
        if not self.name:
            errors.add("name", _("Name is required: %(rule)s.") % {"rule": v.JOB_NAME_RULE})
        if self.training_mode == self.TrainingMode.FINETUNE and not (self.preset_template_id or self.base_model_id):
            errors.add(
                "training_mode",
                _("A fine-tuning job starts from a preset template or a model asset: choose one of them."),
            )
        if self.training_mode == self.TrainingMode.FINETUNE and self.base_model_id:
            if self.base_model.owner_id != self.created_by_id:
                errors.add("base_model", _("Base model must be one of your own model assets."))

    def _clean_training(self, errors: _Errors) -> None:
        if self.image_source == self.ImageSource.PRESET:
            if not self.preset_image_id:
                errors.add("preset_image", _("Choose a preset image (or switch the image source to custom)."))
            else:
                self.image = self.preset_image.image_ref
                self.image_kind = self.preset_image.kind
            if not self.code_dir:
                errors.add(
                    "code_dir", _("Code dir is required with a preset image: %(rule)s.") % {"rule": v.OBS_DIR_RULE}
                )
        elif self.image_source == self.ImageSource.CUSTOM and not self.image:
            errors.add("image", _("Image is required: %(rule)s.") % {"rule": v.IMAGE_RULE})
        if not (self.command or "").strip():
            errors.add("command", _("Start command is required."))
        if self.code_dir and v.parse_obs_dir(self.code_dir):
            # Another workspace's code dir is not measured either: its size is none of this job's business.
            refused = self._bucket_refusal(self.code_dir, _("Code dir"))
            for message in [refused] if refused else storage.code_dir_errors(self.code_dir):
                errors.add("code_dir", message)
        self._check_bucket(errors, "code_backup_dir", _("Code backup dir"))
        for env in self.environments if isinstance(self.environments, list) else []:
            if isinstance(env, dict):  # the stored shape is always complete
                env.setdefault("value", "")
                env.setdefault("sensitive", False)
        for message in environment_errors(self.environments):
            errors.add("environments", message)

    def _clean_resources(self, errors: _Errors) -> None:
        if self.node_count is None or not (v.NODE_COUNT_MIN <= self.node_count <= v.NODE_COUNT_MAX):
            limits = {"min": v.NODE_COUNT_MIN, "max": v.NODE_COUNT_MAX}
            errors.add("node_count", _("Instance count must be between %(min)s and %(max)s.") % limits)
        if self.priority is None or not (v.PRIORITY_MIN <= self.priority <= v.PRIORITY_MAX):
            errors.add(
                "priority",
                _("Priority must be %(min)s-%(max)s (default %(default)s); got %(value)s.")
                % {"min": v.PRIORITY_MIN, "max": v.PRIORITY_MAX, "default": v.PRIORITY_DEFAULT, "value": self.priority},
            )
        if self.dedicated:
            self._clean_dedicated(errors)
        else:
            self.pool = None  # a pool is chosen only with the dedicated pool type
            # Each message whole, so that a translation can word it its own way.
            for field, message, on in [
                (
                    "spec_type",
                    _("A custom spec is only available on a dedicated resource pool."),
                    self.spec_type == self.SpecType.CUSTOM,
                ),
                ("affinity", _("Node affinity is only available on a dedicated resource pool."), bool(self.affinity)),
                (
                    "file_system_mounts",
                    _("Mounting a file system is only available on a dedicated resource pool."),
                    bool(self.file_system_mounts),
                ),
                (
                    "obs_mounts",
                    _("Mounting object storage is only available on a dedicated resource pool."),
                    bool(self.obs_mounts),
                ),
                (
                    "priority",
                    _("A priority other than %(default)s is only available on a dedicated resource pool.")
                    % {"default": v.PRIORITY_DEFAULT},
                    self.priority != v.PRIORITY_DEFAULT,
                ),
                ("preemptible", _("Preemptible is only available on a dedicated resource pool."), self.preemptible),
                ("tensorboard", _("TensorBoard is only available on a dedicated resource pool."), self.tensorboard),
                (
                    "mindstudio_insight",
                    _("MindStudio Insight is only available on a dedicated resource pool."),
                    self.mindstudio_insight,
                ),
                (
                    "retention_hours",
                    _("Retention is only available on a dedicated resource pool."),
                    self.retention_hours is not None,
                ),
            ]:
                if on and field not in errors:
                    errors.add(field, message)
        self._clean_flavor(errors)

    def _clean_dedicated(self, errors: _Errors) -> None:
        pool = self.pool if self.pool_id else None
        if pool is None:
            errors.add("pool", _("Choose a dedicated resource pool (or the public pool type)."))
        elif pool.kind != ResourcePool.Kind.DEDICATED:
            errors.add("pool", _("Pool %(pool)s is a public pool: choose a dedicated pool.") % {"pool": pool.name})
            pool = None
        if self.priority == v.PRIORITY_MAX and "priority" not in errors:
            from jobs.access import check_priority  # access imports this module

            try:
                check_priority(self.created_by if self.created_by_id else None, self.priority)
            except ValidationError as exc:
                for message in exc.messages:
                    errors.add("priority", message)
        if self.spec_type == self.SpecType.CUSTOM:
            self.flavor = None  # a custom spec replaces the flavor
            self._clean_custom_spec(errors, pool)
        elif not self.flavor_id:
            errors.add("flavor", _("Choose a flavor (or a custom spec) for the dedicated pool."))
        elif pool is not None:
            f = self.flavor
            if f.cpus > pool.node_cpus or f.memory_mb / 1024 > pool.node_memory_gb or f.gpus > pool.node_gpus:
                errors.add(
                    "flavor",
                    _("Flavor %(flavor)s is larger than a node of pool %(pool)s (%(size)s).")
                    % {"flavor": f.name, "pool": pool.name, "size": pool.node_size},
                )
        if self.affinity:
            self._clean_affinity(errors, pool)
        self._clean_file_system_mounts(errors)
        self._clean_obs_mounts(errors)

    def _clean_custom_spec(self, errors: _Errors, pool: ResourcePool | None) -> None:
        if self.custom_gpus is None:
            self.custom_gpus = 0
        if pool:
            node = _("pool %(pool)s's node size (%(size)s)") % {"pool": pool.name, "size": pool.node_size}
        else:
            node = _("the pool's node size")
        for field, label, value, minimum, maximum in [
            ("custom_cpus", _("Custom CPUs"), self.custom_cpus, 0.1, pool.node_cpus if pool else None),
            (
                "custom_memory_gb",
                _("Custom memory (GB)"),
                self.custom_memory_gb,
                0.1,
                pool.node_memory_gb if pool else None,
            ),
            ("custom_gpus", _("Custom GPUs"), self.custom_gpus, 0, pool.node_gpus if pool else None),
        ]:
            params = {"label": label, "min": f"{minimum:g}", "node": node}
            if value is None:
                errors.add(
                    field, _("%(label)s is required with a custom spec: at least %(min)s, at most %(node)s.") % params
                )
            elif value < minimum or (maximum is not None and value > maximum):
                bound = f"{maximum:g}, {node}" if maximum is not None else node
                message = _("%(label)s must be between %(min)s and %(bound)s; got %(value)s.")
                errors.add(field, message % (params | {"bound": bound, "value": f"{value:g}"}))

    def _clean_affinity(self, errors: _Errors, pool: ResourcePool | None) -> None:
        hosts = self.affinity_hosts
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
            errors.add("affinity_hosts", _("Affinity hosts must be a list of host names."))
            return
        if not hosts:
            errors.add("affinity_hosts", _("Node affinity needs at least one host."))
            return
        known = set(DockerHost.objects.filter(pool=pool).values_list("name", flat=True)) if pool else set()
        unknown = [h for h in hosts if h not in known]
        if unknown and pool:
            errors.add(
                "affinity_hosts",
                _("Affinity hosts must be hosts of pool %(pool)s: not %(hosts)s.")
                % {"pool": pool.name, "hosts": ", ".join(unknown)},
            )

    def _clean_file_system_mounts(self, errors: _Errors) -> None:
        mounts = self.file_system_mounts
        if not isinstance(mounts, list):
            errors.add("file_system_mounts", _("File system mounts must be a list."))
            return
        if len(mounts) > v.MOUNTS_MAX:
            message = _("File system mounts: at most %(max)s are allowed; got %(count)s.")
            errors.add("file_system_mounts", message % {"max": v.MOUNTS_MAX, "count": len(mounts)})
            return
        keys = {"file_system", "path", "mount_path", "read_only", "options"}
        names = {m.get("file_system") for m in mounts if isinstance(m, dict) and isinstance(m.get("file_system"), str)}
        systems = {fs.name: fs for fs in FileSystem.objects.filter(name__in=names)}
        for number, mount in enumerate(mounts, start=1):
            label = _("File system mount %(number)s") % {"number": number}
            name = mount.get("file_system") if isinstance(mount, dict) else None
            params = {"label": label, "keys": ", ".join(sorted(keys)), "name": name}
            if not isinstance(mount, dict) or set(mount) - keys:
                errors.add("file_system_mounts", _("%(label)s must be an object with %(keys)s.") % params)
                continue
            fs = systems.get(mount["file_system"]) if isinstance(mount.get("file_system"), str) else None
            if fs is None:
                errors.add("file_system_mounts", _("%(label)s: no file system named '%(name)s'.") % params)
            elif self.workspace_id is not None and (message := fs.refusal(self.workspace_id, label)):
                errors.add("file_system_mounts", message)
            path = mount.setdefault("path", "/") or "/"
            mount["path"] = path
            if not isinstance(path, str) or v.normalized_path(path) is None:
                message = _("%(label)s: the directory in the file system must be an absolute path.")
                errors.add("file_system_mounts", message % params)
            mount_label = _("%(label)s: the mount path") % params
            if message := v.mount_path_error(mount.get("mount_path") or "", mount_label):
                errors.add("file_system_mounts", message)
            if not isinstance(mount.setdefault("read_only", False), bool):
                errors.add("file_system_mounts", _("%(label)s: read_only must be true or false.") % params)
            if not isinstance(mount.get("options") or "", str):
                errors.add("file_system_mounts", _("%(label)s: mount options must be a string.") % params)
            elif fs is not None and fs.kind == FileSystem.Kind.NFS:
                mount["options"] = mount.get("options") or v.DEFAULT_NFS_OPTIONS
                if message := v.nfs_options_error(mount["options"]):
                    errors.add("file_system_mounts", _("%(label)s: %(message)s") % {"label": label, "message": message})
            else:
                mount["options"] = mount.get("options") or ""

    def _clean_flavor(self, errors: _Errors) -> None:
        if not self.flavor_id or "flavor" in errors:
            return
        flavor = self.flavor
        if flavor.single_process and (self.node_count or 1) > 1:
            errors.add(
                "flavor",
                _(
                    "Flavor %(flavor)s is single-process: it refuses multi-process jobs "
                    "(instance count must be 1; got %(count)s)."
                )
                % {"flavor": flavor.name, "count": self.node_count},
            )
        if not self.dedicated and self.image_kind in ProcessorKind.values and self.image_kind != flavor.kind:
            errors.add(
                "flavor",
                _(
                    "On the public pool the image and the flavor must be of the same kind (all CPU or all GPU): "
                    "the image is %(image_kind)s, flavor %(flavor)s is %(flavor_kind)s."
                )
                % {
                    "image_kind": ProcessorKind(self.image_kind).label,
                    "flavor": flavor.name,
                    "flavor_kind": ProcessorKind(flavor.kind).label,
                },
            )

    def _clean_data(self, errors: _Errors) -> None:
        ids = self.datasets
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            errors.add("datasets", _("Datasets must be a list of dataset ids."))
            return
        if len(ids) > v.DATASETS_MAX:
            message = _("Datasets: at most %(max)s are allowed; got %(count)s.")
            errors.add("datasets", message % {"max": v.DATASETS_MAX, "count": len(ids)})
            return
        if len(set(ids)) != len(ids):
            errors.add("datasets", _("Datasets: each dataset may be chosen once."))
        found = {d.id: d for d in Dataset.objects.filter(id__in=ids)}
        for i in ids:
            dataset = found.get(i)
            name = {"name": dataset.name if dataset is not None else i}
            if dataset is None:
                errors.add("datasets", _("Dataset %(name)s does not exist.") % name)
            elif not dataset.is_preset and dataset.owner_id != self.created_by_id:
                errors.add("datasets", _("Dataset %(name)s is not yours: choose preset data or your own data.") % name)
            elif not dataset.online:
                errors.add("datasets", _("Dataset %(name)s is offline: only online data can be used.") % name)
            elif message := self._bucket_refusal(dataset.path, _("Dataset %(name)s") % name):
                errors.add("datasets", message)

    def _clean_storage(self, errors: _Errors) -> None:
        if self.store_artifacts:
            if not self.artifact_path:
                message = _("Storage path is required to store artifacts: %(rule)s.")
                errors.add("artifact_path", message % {"rule": v.OBS_DIR_RULE})
            self._check_bucket(errors, "artifact_path", _("Artifact storage path"))
            if not self.artifact_mount_path:
                message = _("Artifact mount path is required: %(rule)s.")
                errors.add("artifact_mount_path", message % {"rule": v.ARTIFACT_MOUNT_RULE})
        if not self.auto_publish:
            return
        if not self.store_artifacts:
            errors.add("auto_publish", _("Auto-publishing the final model needs store artifacts on."))
        if self.publish_as == self.PublishAs.NEW:
            if not self.model_name:
                message = _("Model name is required for a new model: %(rule)s.")
                errors.add("model_name", message % {"rule": v.MODEL_NAME_RULE})
            else:
                try:
                    v.validate_model_name(self.model_name)
                except ValidationError as exc:
                    errors.add("model_name", exc.messages[0])
                else:
                    if Model.objects.filter(owner_id=self.created_by_id, name=self.model_name).exists():
                        message = _("You already have a model named %(name)s: publish as a new version of it.")
                        errors.add("model_name", message % {"name": self.model_name})
            if not self.model_type:
                message = _("Model type is required for a new model: %(types)s.")
                errors.add("model_type", message % {"types": ", ".join(str(label) for label in Model.Type.labels)})
            if not (self.model_description or "").strip():
                errors.add("model_description", _("Model description is required for a new model."))
        elif self.publish_as == self.PublishAs.VERSION:
            if not self.publish_model_id:
                errors.add("publish_model", _("Choose the model to publish a new version of."))
            elif self.publish_model.owner_id != self.created_by_id:
                errors.add("publish_model", _("A new version can only be published to one of your own models."))

    def _clean_high_availability(self, errors: _Errors) -> None:
        if self.fault_tolerance and (
            self.max_restarts is None or not (v.MAX_RESTARTS_MIN <= self.max_restarts <= v.MAX_RESTARTS_MAX)
        ):
            message = _("Max restarts must be between %(min)s and %(max)s when fault tolerance is on.")
            errors.add("max_restarts", message % {"min": v.MAX_RESTARTS_MIN, "max": v.MAX_RESTARTS_MAX})
        if self.pod_retry_num is not None and not (0 <= self.pod_retry_num <= v.POD_RETRY_MAX):
            message = _("Instance rescheduling count must be between 0 and %(max)s.")
            errors.add("pod_retry_num", message % {"max": v.POD_RETRY_MAX})
        if not self.fault_tolerance and (self.unconditional_restart or self.hang_restart or self.pod_retry_num):
            errors.add(
                "fault_tolerance",
                _("Unconditional restart, hang restart and instance rescheduling need fault tolerance on."),
            )

    def _clean_access(self, errors: _Errors) -> None:
        if self.ssh_remote and self.mutual_trust:
            errors.add(
                "mutual_trust",
                _("SSH remote development and mutual-trust SSH files exclude each other: turn one of them off."),
            )
        if self.ssh_remote:
            if not self.ssh_key_pair_id:
                errors.add("ssh_key_pair", _("SSH remote development needs a key pair of yours: create or choose one."))
            elif self.ssh_key_pair.owner_id != self.created_by_id:
                errors.add("ssh_key_pair", _("SSH remote development needs a key pair of yours, not someone else's."))
        if self.mutual_trust and not self.mutual_trust_dir:
            message = _("Mutual-trust SSH files dir is required (default %(default)s).")
            errors.add("mutual_trust_dir", message % {"default": v.DEFAULT_MUTUAL_TRUST_DIR})

    def _clean_observe(self, errors: _Errors) -> None:
        if self.tensorboard and self.mindstudio_insight:
            errors.add(
                "mindstudio_insight", _("TensorBoard and MindStudio Insight exclude each other: turn one of them off.")
            )
        elif (self.tensorboard or self.mindstudio_insight) and self.dedicated:
            tool = {"tool": "TensorBoard" if self.tensorboard else "MindStudio Insight"}
            if not self.observe_file_system_id:
                errors.add("observe_file_system", _("%(tool)s needs a file system for its summaries.") % tool)
            elif self.workspace_id is not None and (
                message := self.observe_file_system.refusal(self.workspace_id, _("%(tool)s summaries") % tool)
            ):
                errors.add("observe_file_system", message)
            if not self.observe_path:
                message = _("%(tool)s needs a summary path (default %(default)s).")
                errors.add("observe_path", message % (tool | {"default": v.DEFAULT_SUMMARY_PATH}))
        if self.metrics_mode == self.MetricsMode.HTTP:
            if not re.match(r"^/\S*$", self.metrics_path or ""):
                errors.add(
                    "metrics_path", _("Prometheus metrics by HTTP need a URL path starting with '/', e.g. /metrics.")
                )
            port = self.metrics_port
            if not isinstance(port, int) or isinstance(port, bool) or not (v.PORT_MIN <= port <= v.PORT_MAX):
                message = _("Prometheus metrics port must be %(min)s-%(max)s; got %(value)s.")
                errors.add("metrics_port", message % {"min": v.PORT_MIN, "max": v.PORT_MAX, "value": port})
        elif self.metrics_mode == self.MetricsMode.COMMAND and not (self.metrics_command or "").strip():
            errors.add("metrics_command", _("Prometheus metrics by command need a command printing Prometheus text."))

    def _clean_more(self, errors: _Errors) -> None:
        if self.keep_logs is None:
            npu = bool(self.flavor_id and self.flavor.npu)
            self.keep_logs = npu or bool(self.log_export_path)
        if self.keep_logs and not self.log_export_path:
            message = _(
                "Log path is required when logs are kept permanently (on by default for NPU flavors): %(rule)s."
            )
            errors.add("log_export_path", message % {"rule": v.OBS_DIR_RULE})
        if self.keep_logs:
            self._check_bucket(errors, "log_export_path", _("Log path"))
        if message := v.hours_error(_("Auto stop"), self.auto_stop_hours):
            errors.add("auto_stop_hours", message)
        if message := v.hours_error(_("Retention"), self.retention_hours, empty=_("containers removed at the end")):
            if "retention_hours" not in errors:
                errors.add("retention_hours", message)
        elif self.retention_hours is not None and self.fault_tolerance:
            errors.add(
                "retention_hours",
                _("Retention is incompatible with fault tolerance: turn off fault tolerance or retention."),
            )
        for tag in self.tags if isinstance(self.tags, list) else []:
            if isinstance(tag, dict):
                tag.setdefault("value", "")
        for message in tag_errors(self.tags):
            errors.add("tags", message)

    def _clean_mount_paths_unique(self, errors: _Errors) -> None:
        """Every path something is mounted at in the containers is unique (SPEC §3 "file system mounts")."""
        seen: dict[str, str] = {}

        def claim(field: str, path) -> None:
            normal = v.normalized_path(path) if isinstance(path, str) else None
            if normal is None:
                return
            if normal in seen and field not in errors:
                errors.add(
                    field, _("Mount path %(path)s is used twice: mount paths must be unique.") % {"path": normal}
                )
            seen.setdefault(normal, field)

        # The directories the console itself binds (jobs/runtime/layout.py) come first, so the
        # message goes to the setting that collides with them.
        claim("local_code_dir", self.local_code_dir or v.DEFAULT_LOCAL_CODE_DIR)
        if self.mutual_trust:
            claim("mutual_trust_dir", self.mutual_trust_dir or v.DEFAULT_MUTUAL_TRUST_DIR)
        elif self.ssh_remote:
            claim("ssh_remote", v.DEFAULT_MUTUAL_TRUST_DIR)  # authorized_keys in /home/ma-user/.ssh
        if self.dedicated:
            for mount in self.file_system_mounts if isinstance(self.file_system_mounts, list) else []:
                if isinstance(mount, dict):
                    claim("file_system_mounts", mount.get("mount_path"))
            for mount in self.obs_mounts if isinstance(self.obs_mounts, list) else []:
                if isinstance(mount, dict):
                    claim("obs_mounts", mount.get("mount_path"))
            if self.tensorboard or self.mindstudio_insight:
                claim("observe_path", self.observe_path)
        if self.store_artifacts:
            claim("artifact_mount_path", self.artifact_mount_path)

    def _clean_notifications(self, errors: _Errors) -> None:
        emails = [e.strip() for e in (self.notify_emails or "").split(",") if e.strip()]
        bad = [e for e in emails if not v.EMAIL_RE.match(e)]
        if bad:
            errors.add("notify_emails", _("Not an e-mail address: %(addresses)s.") % {"addresses": ", ".join(bad)})
        unknown = set(self.notify_events or []) - {str(kind) for kind in NOTIFIABLE_EVENTS}
        if unknown:
            message = _("Unknown notification events: %(events)s.")
            errors.add("notify_events", message % {"events": ", ".join(sorted(unknown))})
        elif self.notify_events and not (self.notify_webhook_url or emails):
            errors.add("notify_events", _("Choose a topic (webhook URL or e-mail addresses) for the notifications."))
