from django.apps import AppConfig
from django.utils.translation import gettext_lazy as _


class JobsConfig(AppConfig):
    name = "jobs"
    verbose_name = _("Training jobs")

    def ready(self) -> None:
        from django.db.models.signals import post_delete

        from .models import TrainingJob

        post_delete.connect(_job_deleted, sender=TrainingJob, dispatch_uid="jobs.remove_files_of_deleted_job")


def _job_deleted(sender, instance, **kwargs) -> None:
    """Every way a job is deleted (the API, the admin's delete and its bulk action): the files it
    kept on the console's disk go once the delete commits (cleanup.remove_files_of_deleted_job)."""
    from django.db import transaction

    from .runtime import cleanup

    job_id = instance.id
    transaction.on_commit(lambda: cleanup.remove_files_of_deleted_job(job_id))
