from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render

from jobs.access import visible_jobs


@login_required
def job_list(request):
    jobs = visible_jobs(request.user).select_related("workspace")
    page = Paginator(jobs, 25).get_page(request.GET.get("page"))
    for job in page:
        job.duration_text = _hms(job.duration())
    return render(request, "jobs/job_list.html", {"page": page})


def _hms(delta) -> str:
    """A duration as H:MM:SS (hours may exceed 24); empty before the job started."""
    if delta is None:
        return ""
    minutes, seconds = divmod(max(0, int(delta.total_seconds())), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"
