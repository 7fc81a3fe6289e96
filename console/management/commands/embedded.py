"""The one-process console of the run command.

daphne serves HTTP and websockets; a Celery worker (thread pool) and the
periodic reconcile run in threads of the same process, with the memory://
broker and the in-memory channel layer. Same tasks, same code as production;
only the transports differ.
"""

import threading
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Serve the console with an in-process worker (embedded mode: no Redis needed)."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--concurrency", type=int, default=32)

    def handle(self, *args, host, port, concurrency, **options):
        if not settings.EMBEDDED:
            raise CommandError("REDIS_URL is set: run daphne and celery workers instead (see README).")
        import daphne.server  # installs the asyncio reactor first
        from channels.routing import get_default_application
        from daphne.endpoints import build_endpoint_description_strings

        from console import realtime
        from console.celery import app

        realtime.use_server_loop(daphne.server.twisted_loop)
        threading.Thread(target=self._worker, args=(app, concurrency), name="celery-worker", daemon=True).start()
        threading.Thread(target=self._beat, args=(app,), name="reconcile", daemon=True).start()
        server = daphne.server.Server(
            application=get_default_application(),
            endpoints=build_endpoint_description_strings(host=host, port=port),
            signal_handlers=True,
            # No cap on a page's websocket (daphne's default closes it after 24 h with a normal
            # close, which htmx does not reconnect): access is checked again every few seconds.
            websocket_timeout=-1,
        )
        server.run()

    @staticmethod
    def _worker(app, concurrency: int) -> None:
        from celery.worker import WorkController

        WorkController(app=app, pool_cls="threads", concurrency=concurrency, loglevel="WARNING").start()

    @staticmethod
    def _beat(app) -> None:
        from jobs import tasks

        while True:
            time.sleep(settings.RECONCILE_INTERVAL_S)
            tasks.reconcile.delay()
