from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpResponse, StreamingHttpResponse
from django.shortcuts import get_object_or_404, render
from django.template.loader import render_to_string
from django.views.decorators.http import require_POST

from jobs.access import visible_jobs
from jobs.models import TaskRun, TrainingJob
from jobs.runtime import lifecycle
from jobs.runtime.logs import read_lines

TABS = ("overview", "logs", "recovery", "attempts")


def job_context(job: TrainingJob) -> dict:
    attempts = list(job.attempts.prefetch_related("task_runs__host").order_by("-number"))
    return {
        "job": job,
        "attempts": attempts,
        "recoveries": list(job.recoveries.select_related("failed_attempt", "next_attempt")),
        "instances": range(job.node_count),
    }


def job_live_fragments(job: TrainingJob) -> str:
    """The parts of the job page a websocket refreshes, as out-of-band swaps."""
    context = job_context(job) | {"oob": True}
    return "".join(
        render_to_string(name, context)
        for name in ("jobs/_job_header.html", "jobs/_attempts.html", "jobs/_recoveries.html")
    )


@login_required
def job_detail(request, job_id):
    job = get_object_or_404(visible_jobs(request.user), id=job_id)
    tab = request.GET.get("tab", "overview")
    if tab not in TABS:
        raise Http404("No such tab")
    context = job_context(job) | {"tab": tab, "instance": _instance(request, job)}
    if request.htmx and not request.htmx.boosted:
        return render(request, f"jobs/_tab_{tab}.html", context)
    return render(request, "jobs/job_detail.html", context)


def _instance(request, job: TrainingJob) -> int:
    try:
        index = int(request.GET.get("instance", 0))
    except ValueError:
        return 0
    return index if 0 <= index < job.node_count else 0


@login_required
@require_POST
def job_stop(request, job_id):
    job = get_object_or_404(visible_jobs(request.user), id=job_id)
    lifecycle.request_terminate(job.id)
    job.refresh_from_db()
    return render(request, "jobs/_job_header.html", job_context(job))


@login_required
def job_log_download(request, job_id, index):
    job = get_object_or_404(visible_jobs(request.user), id=job_id)
    runs = TaskRun.objects.filter(attempt__job=job, index=index).select_related("attempt", "host")

    def lines():
        for run in runs.order_by("attempt__number"):
            yield f"# attempt {run.attempt.number} on {run.host.name}, container {run.container_name}\n"
            for line in read_lines(run):
                yield line.text + "\n"

    response = StreamingHttpResponse(lines(), content_type="text/plain; charset=utf-8")
    response["Content-Disposition"] = f'inline; filename="{job.name}-worker-{index}.log"'
    return response


def healthz(request):
    return HttpResponse("ok", content_type="text/plain")
