"""Open an instance's JupyterLab or TensorBoard: the console's side of the hand-over (jobs/proxy/)."""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect
from django.shortcuts import render

from ..access import visible_job_or_404
from ..proxy import tickets
from ..proxy.asgi import LOGIN_PATH
from ..proxy.origins import APPS, Target, origin
from ..terminal import running_task_run

FIRST_PAGE = {"lab": "/lab", "tb": "/"}


@login_required
def open_app(request: HttpRequest, job_id, app: str, index: int) -> HttpResponse:
    """Redirect to the app's origin with a one-minute ticket; or say why it cannot open."""
    if app not in APPS:
        raise Http404("No such app")
    job = visible_job_or_404(request.user, id=job_id)
    target = Target(APPS[app], job.id, index)
    if not getattr(job, target.app.field):
        raise Http404(f"This job did not ask for {target.app.name}.")
    run = running_task_run(request.user, job.id, index)
    if run is None:
        context = {"job": job, "app": target.app, "index": index}
        return render(request, "jobs/app_unavailable.html", context, status=409)
    if not request.session.session_key:
        request.session.save()
    grant = tickets.Grant(request.user.pk, request.session.session_key)
    query = urlencode({"ticket": tickets.ticket(grant, target), "next": FIRST_PAGE[app]})
    url = f"{origin(target, scheme=request.scheme, console_host=request.get_host())}{LOGIN_PATH}?{query}"
    response = HttpResponseRedirect(url)
    response["Referrer-Policy"] = "no-referrer"
    response["Cache-Control"] = "no-store"
    return response
