from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render

from jobs.access import visible_jobs


@login_required
def job_list(request):
    jobs = visible_jobs(request.user).select_related("workspace")
    page = Paginator(jobs, 25).get_page(request.GET.get("page"))
    return render(request, "jobs/job_list.html", {"page": page})
