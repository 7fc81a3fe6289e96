from django.contrib import admin, messages

from faulttolerance.models import RecoveryRecord

from .models import (
    Attempt,
    DockerHost,
    Flavor,
    JobEvent,
    Notification,
    PresetImage,
    ResourcePool,
    TaskRun,
    TrainingJob,
    Workspace,
)
from .runtime import lifecycle


@admin.register(Workspace)
class WorkspaceAdmin(admin.ModelAdmin):
    list_display = ["name", "project_id"]
    search_fields = ["name", "project_id"]
    filter_horizontal = ["members"]
    readonly_fields = ["project_id"]


@admin.register(ResourcePool)
class ResourcePoolAdmin(admin.ModelAdmin):
    list_display = ["name", "kind", "check_root_gb", "check_shm_gb", "check_cache_gb", "shm_size_gb"]
    list_filter = ["kind"]
    search_fields = ["name"]


@admin.register(Flavor)
class FlavorAdmin(admin.ModelAdmin):
    list_display = ["name", "cpus", "memory_mb", "gpus", "gpu_type", "uses_ib", "single_process"]
    list_filter = ["gpus", "uses_ib", "single_process"]
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

    @admin.action(description="Clear isolation (host gets new instances again)")
    def clear_isolation(self, request, queryset):
        count = queryset.update(isolated=False, isolation_reason="", isolated_at=None)
        self.message_user(request, f"Cleared isolation of {count} host(s).")


@admin.register(PresetImage)
class PresetImageAdmin(admin.ModelAdmin):
    list_display = ["name", "image_ref", "description"]
    search_fields = ["name", "image_ref"]


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
    list_filter = ["phase", "fault_tolerance", "workspace"]
    search_fields = ["name", "id", "created_by__username"]
    date_hierarchy = "created_at"
    inlines = [AttemptInline, RecoveryInline]
    actions = ["force_stop"]

    def get_readonly_fields(self, request, obj=None):
        # The spec of a submitted job is history: operators read it, users copy it.
        return [f.name for f in TrainingJob._meta.fields] if obj else []

    @admin.action(description="Force stop (terminate, no restart)")
    def force_stop(self, request, queryset):
        stopped = sum(lifecycle.request_terminate(job.id) for job in queryset)
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
