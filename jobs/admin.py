from django.contrib import admin, messages
from django.utils import timezone

from faulttolerance.models import RecoveryRecord

from .models import (
    FINAL_PHASES,
    Attempt,
    Bucket,
    Dataset,
    DockerHost,
    FileSystem,
    Flavor,
    JobEvent,
    KeyPair,
    Model,
    ModelVersion,
    Notification,
    PresetImage,
    PresetTemplate,
    ResourcePool,
    TaskRun,
    TrainingJob,
    Workspace,
)
from .runtime import stop


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ["name", "project_id"]
    search_fields = ["name", "project_id"]
    filter_horizontal = ["members"]
    readonly_fields = ["project_id"]


@admin.register(ResourcePool)
class ResourcePoolAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "kind",
        "node_cpus",
        "node_memory_gb",
        "node_gpus",
        "check_root_gb",
        "check_shm_gb",
        "check_cache_gb",
        "shm_size_gb",
        "default_cpus",
        "default_memory_mb",
        "pids_limit",
    ]
    list_filter = ["kind"]
    search_fields = ["name"]
    fieldsets = [
        (None, {"fields": ["name", "kind"]}),
        ("Node size (limits a custom spec)", {"fields": ["node_cpus", "node_memory_gb", "node_gpus"]}),
        (
            "Environment checks and containers",
            {
                "fields": [
                    "check_root_gb",
                    "check_shm_gb",
                    "check_cache_gb",
                    "check_ulimit_memlock",
                    "check_ulimit_nofile",
                    "check_ulimit_stack",
                    "check_ulimit_nproc",
                    "shm_size_gb",
                ]
            },
        ),
        (
            "Limits of every container (SPEC §8: no job runs unbounded on a shared host)",
            {
                "fields": ["default_cpus", "default_memory_mb", "pids_limit"],
                "description": "CPUs and memory apply to instances of jobs without a flavor or custom spec; "
                "the PIDs limit (processes and threads) to every container of the pool's hosts.",
            },
        ),
    ]


@admin.register(Flavor)
class FlavorAdmin(admin.ModelAdmin):
    list_display = ["name", "cpus", "memory_mb", "gpus", "gpu_type", "npu", "uses_ib", "single_process"]
    list_filter = ["npu", "gpus", "uses_ib", "single_process"]
    search_fields = ["name", "gpu_type"]


@admin.register(DockerHost)
class DockerHostAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "base_url",
        "pool",
        "enabled",
        "hot_standby",
        "isolated",
        "isolation_reason",
        "last_seen_at",
    ]
    list_filter = ["enabled", "isolated", "hot_standby", "pool"]
    search_fields = ["name", "base_url"]
    actions = ["clear_isolation"]
    fieldsets = [
        (None, {"fields": ["name", "base_url", "pool", "address", "enabled", "hot_standby"]}),
        (
            "TLS (tcp:// engines only)",
            {"fields": ["tls_ca_cert", "tls_client_cert", "tls_client_key"], "classes": ["collapse"]},
        ),
        ("Health", {"fields": ["isolated", "isolation_reason", "isolated_at", "last_seen_at"]}),
    ]

    # Changes the host: only staff who may change hosts (a view-only operator sees no such action).
    @admin.action(description="Clear isolation (host gets new instances again)", permissions=["change"])
    def clear_isolation(self, request, queryset):
        # Seen now, on the operator's word: a first slow ping does not isolate it again (liveness.py).
        count = queryset.update(isolated=False, isolation_reason="", isolated_at=None, last_seen_at=timezone.now())
        self.message_user(request, f"Cleared isolation of {count} host(s).")


@admin.register(PresetImage)
class PresetImageAdmin(admin.ModelAdmin):
    list_display = ["name", "image_ref", "kind", "description"]
    list_filter = ["kind"]
    search_fields = ["name", "image_ref", "description"]


@admin.register(PresetTemplate)
class PresetTemplateAdmin(admin.ModelAdmin):
    list_display = ["name", "type", "brand", "image", "code_dir", "description"]
    list_filter = ["type", "brand", "image"]
    search_fields = ["name", "brand", "description", "command"]
    autocomplete_fields = ["image"]


@admin.register(Bucket)
class BucketAdmin(admin.ModelAdmin):
    """Who owns a bucket folder and which workspaces it is granted to; a folder without a row here
    belongs to nobody (docs/decisions.md "Workspaces own their storage")."""

    list_display = ["name", "workspace", "granted", "description"]
    list_filter = ["workspace", "granted_to"]
    search_fields = ["name", "description", "workspace__name"]
    filter_horizontal = ["granted_to"]

    def get_queryset(self, request):
        return super().get_queryset(request).select_related("workspace").prefetch_related("granted_to")

    @admin.display(description="granted to")
    def granted(self, bucket: Bucket) -> str:
        return ", ".join(w.name for w in bucket.granted_to.all()) or "-"


@admin.register(FileSystem)
class FileSystemAdmin(admin.ModelAdmin):
    """A file system is mounted by jobs of the workspaces granted here, no other."""

    list_display = ["name", "kind", "source", "granted", "description"]
    list_filter = ["kind", "workspaces"]
    search_fields = ["name", "source", "description"]
    filter_horizontal = ["workspaces"]

    def get_queryset(self, request):
        return super().get_queryset(request).prefetch_related("workspaces")

    @admin.display(description="granted to")
    def granted(self, fs: FileSystem) -> str:
        return ", ".join(w.name for w in fs.workspaces.all()) or "(no workspace)"


@admin.register(Dataset)
class DatasetAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "online", "path", "created_at"]
    list_filter = ["online", ("owner", admin.EmptyFieldListFilter)]
    search_fields = ["name", "path", "owner__username", "description"]
    list_editable = ["online"]


class ModelVersionInline(admin.TabularInline):
    model = ModelVersion
    extra = 0
    can_delete = False
    fields = ["label", "description", "job", "artifact_path", "created_at"]
    readonly_fields = ["label", "job", "artifact_path", "created_at"]


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "type", "brand", "created_at"]
    list_filter = ["type", "brand"]
    search_fields = ["name", "owner__username", "description"]
    inlines = [ModelVersionInline]


@admin.register(ModelVersion)
class ModelVersionAdmin(admin.ModelAdmin):
    list_display = ["model", "label", "job", "created_at"]
    list_filter = ["model__type"]
    search_fields = ["model__name", "description", "job__name"]
    # The version number is the platform's (V1, then previous + 1): never edited by hand.
    readonly_fields = ["number", "job", "artifact_path", "created_at"]


@admin.register(KeyPair)
class KeyPairAdmin(admin.ModelAdmin):
    list_display = ["name", "owner", "fingerprint", "created_at"]
    list_filter = ["created_at"]
    search_fields = ["name", "owner__username", "public_key"]


class TaskRunInline(admin.TabularInline):
    model = TaskRun
    extra = 0
    can_delete = False
    fields = [
        "index",
        "host",
        "container_name",
        "container_id",
        "state",
        "started_at",
        "ended_at",
        "exit_code",
        "oom_killed",
        "log_lines",
    ]
    readonly_fields = fields


@admin.register(Attempt)
class AttemptAdmin(admin.ModelAdmin):
    list_display = ["job", "number", "level", "state", "outcome", "started_at", "ended_at"]
    list_filter = ["state", "outcome", "level"]
    search_fields = ["job__name"]
    inlines = [TaskRunInline]
    readonly_fields = [f.name for f in Attempt._meta.fields]


class AttemptInline(admin.TabularInline):
    model = Attempt
    fk_name = "job"  # Attempt also points at the job that preempted it
    extra = 0
    can_delete = False
    show_change_link = True
    fields = ["number", "level", "state", "outcome", "started_at", "ended_at"]
    readonly_fields = fields


class RecoveryInline(admin.TabularInline):
    model = RecoveryRecord
    fk_name = "job"
    extra = 0
    can_delete = False
    fields = ["detected_at", "failure_class", "exit_code", "decision", "restarts_used_after", "running_again_at"]
    readonly_fields = fields


@admin.register(TrainingJob)
class TrainingJobAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "workspace",
        "created_by",
        "phase",
        "restarts_used",
        "max_restarts",
        "node_count",
        "created_at",
    ]
    list_filter = ["phase", "pool_type", "pool", "training_mode", "fault_tolerance", "workspace"]
    search_fields = ["name", "id", "created_by__username"]
    date_hierarchy = "created_at"
    inlines = [AttemptInline, RecoveryInline]
    actions = ["force_stop"]

    def get_readonly_fields(self, request, obj=None):
        # The spec of a submitted job is history: operators read it, users copy it.
        # Env vars are shown masked: sensitive values never leave the database again.
        if obj is None:
            return []
        return [f.name if f.name != "environments" else "env_vars" for f in TrainingJob._meta.fields]

    def get_exclude(self, request, obj=None):
        return ["environments"] if obj else []

    @admin.display(description="Env vars")
    def env_vars(self, obj):
        return "\n".join(f"{e['name']}={e['value']}" for e in obj.environments_masked()) or "-"

    def has_delete_permission(self, request, obj=None):
        # As the API: a job is deleted once it has ended (force stop it first). A job deleted while
        # it starts or runs would leave its containers to the orphan scan and its files to a start
        # still writing them. The bulk action asks this of each chosen job and refuses them all
        # when one has not ended (its confirmation page says which type it may not delete).
        if obj is not None and obj.phase not in FINAL_PHASES:
            return False
        return super().has_delete_permission(request, obj)

    # Ends a job: only staff who may change jobs.
    @admin.action(description="Force stop (terminate, no restart)", permissions=["change"])
    def force_stop(self, request, queryset):
        stopped = sum(stop.request_terminate(job.id) for job in queryset)
        self.message_user(request, f"Stopping {stopped} job(s).", messages.SUCCESS)


@admin.register(TaskRun)
class TaskRunAdmin(admin.ModelAdmin):
    list_display = ["container_name", "host", "state", "exit_code", "oom_killed", "started_at", "ended_at", "log_lines"]
    list_filter = ["state", "host"]
    search_fields = ["container_name", "container_id", "attempt__job__name"]
    readonly_fields = [f.name for f in TaskRun._meta.fields]


@admin.register(JobEvent)
class JobEventAdmin(admin.ModelAdmin):
    list_display = ["at", "job", "kind", "message"]
    list_filter = ["kind"]
    search_fields = ["job__name", "message"]
    date_hierarchy = "at"
    readonly_fields = [f.name for f in JobEvent._meta.fields]


@admin.register(Notification)
class NotificationAdmin(admin.ModelAdmin):
    list_display = ["event", "transport", "target", "status", "tries", "sent_at"]
    list_filter = ["status", "transport"]
    search_fields = ["target", "event__job__name"]
    readonly_fields = [f.name for f in Notification._meta.fields]
