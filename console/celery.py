import gc
import os

from celery import Celery
from celery.signals import worker_init, worker_ready

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


GC_THRESHOLDS = (20_000, 10, 10)  # Python's: (700, 10, 10)


@worker_ready.connect
def freeze_what_startup_made(sender=None, **kwargs) -> None:
    """Leave what the worker loaded at startup (Django, the SDKs, the project: most of its
    objects, and objects that live as long as it) out of every later garbage collection. A full
    collection stops every thread of the process, and it walked all of them: beside 200 followed
    instances it took 150-880 ms every 10-30 s, and a stop or a restart that met one waited for
    it (docs/decisions.md, "Garbage collections beside 200 followers")."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
