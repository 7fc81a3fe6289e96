"""JupyterLab and TensorBoard of a running instance, through the console
(docs/decisions.md "JupyterLab and TensorBoard through the console").

Each app of each instance has an origin of its own, `<app>-<job hex>-<index>.<APPS_DOMAIN>`
(`origins.py`): what the app serves is the job's code, and on the console's own origin its
JavaScript would act with the user's console session. Daphne serves those origins too:
console/asgi.py hands every request whose Host is one of them to `application` here, before
Django. The console's page hands over with a one-minute ticket (`tickets.py`, views in
jobs/views/apps.py); the app's origin then has a cookie of its own, bound to the console
session, checked with the user's access and the instance's state on every request
(`access.py`). Bytes travel through an exec of the console's nc inside the container
(jobs/runtime/engine_exec.py `open_relay`): no network route to a job, no published port.
"""

from __future__ import annotations

from .asgi import application, is_app_host

__all__ = ["application", "is_app_host"]
