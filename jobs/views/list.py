from __future__ import annotations

from urllib.parse import urlencode

from django.contrib.auth.decorators import login_required
from django.core.paginator import Paginator
from django.shortcuts import render
from django.template.loader import render_to_string

from jobs.access import visible_jobs, workspaces_of
from jobs.listing import JobQuery, fetch_page
from jobs.models import Phase

PAGE_SIZE = 25


def list_context(user, params) -> dict:
    """The job list for `user` under the query in `params` (the page's GET, or the websocket's query string)."""
    query, errors = JobQuery.parse(params)
    jobs = visible_jobs(user)
    # The count and the page's ids from the sorted list, then the page's rows (jobs.listing.fetch_page).
    page = Paginator(query.apply(jobs).values_list("pk", flat=True), PAGE_SIZE).get_page(params.get("page"))
    page.object_list = fetch_page(page.object_list, jobs.select_related("workspace"))
    for job in page:
        job.duration_text = _hms(job.duration())
    base = query.params()
    return {
        "page": page,
        "query": query,
        "errors": errors,
        "phases": Phase.choices,
        "query_string": urlencode(base),
        "page_query_string": urlencode(base | {"page": page.number}),
        "show_workspace": workspaces_of(user).count() > 1,
    }


def list_rows(user, params) -> tuple[str, list]:
    """The rows part of the list as an out-of-band swap, and the ids of the jobs it shows (for the websocket)."""
    context = list_context(user, params) | {"oob": True}
    return render_to_string("jobs/_job_rows.html", context).strip(), [job.id for job in context["page"]]


@login_required
def job_list(request):
    """The whole page, or (an htmx request from the filter form or the pager) only its results."""
    context = list_context(request.user, request.GET)
    template = "jobs/_job_results.html" if request.htmx and not request.htmx.boosted else "jobs/job_list.html"
    return render(request, template, context)


def _hms(delta) -> str:
    """A duration as H:MM:SS (hours may exceed 24); empty before the job started."""
    if delta is None:
        return ""
    minutes, seconds = divmod(max(0, int(delta.total_seconds())), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}"
