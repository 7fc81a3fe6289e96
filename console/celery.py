import os

from celery import Celery
from celery.signals import worker_init

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "console.settings")

app = Celery("console")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


@worker_init.connect
def start_followers(sender=None, **kwargs) -> None:
    """Every worker process follows running instances in threads of its own, beside Celery's
    worker slots (jobs/runtime/followers.py): a container that runs for days holds no slot."""
    import django

    django.setup()  # idempotent; Celery's Django fixup may run after this receiver
    from jobs.runtime.followers import start_local_pool

    start_local_pool()
