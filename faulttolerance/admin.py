from django.contrib import admin

from .models import RecoveryRecord


@admin.register(RecoveryRecord)
class RecoveryRecordAdmin(admin.ModelAdmin):
    list_display = [
        "job",
        "detected_at",
        "failure_class",
        "exit_code",
        "decision",
        "restarts_used_after",
        "max_restarts",
        "running_again_at",
    ]
    list_filter = ["failure_class", "restart", "level"]
    search_fields = ["job__name", "explanation"]
    readonly_fields = [f.name for f in RecoveryRecord._meta.fields]
