"""The page of an instance's terminal (jobs/terminal.py is its websocket)."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from ..access import visible_job_or_404
from ..terminal import running_task_run


@login_required
def job_terminal(request: HttpRequest, job_id, index: int) -> HttpResponse:
    """A shell in worker-<index> of the job, for anyone who may see the job, while it runs. The
    page of an instance that does not run says so (the socket would refuse it anyway)."""
    job = visible_job_or_404(request.user, id=job_id)
    if not 0 <= index < job.node_count:
        raise Http404("No such instance")
    run = running_task_run(request.user, job.id, index)
    context = {"job": job, "index": index, "run": run, "ws_path": f"/ws/jobs/{job.id}/terminal/{index}/"}
    return render(request, "jobs/terminal.html", context)
