from django.contrib.auth.decorators import login_required
from django.db import transaction
from django.http import HttpResponseRedirect
from django.shortcuts import render
from django.urls import reverse
from django_htmx.http import HttpResponseClientRedirect

from jobs.forms import JobCreateForm
from jobs.runtime import lifecycle


@login_required
def job_create(request):
    form = JobCreateForm(request.POST or None, user=request.user)
    if request.method == "POST":
        form.instance.created_by = request.user
        if form.is_valid():
            with transaction.atomic():
                job = form.save()
                lifecycle.submit(job)
            url = reverse("job-detail", args=[job.id])
            return HttpResponseClientRedirect(url) if request.htmx else HttpResponseRedirect(url)
    template = "jobs/_create_form.html" if request.htmx else "jobs/job_create.html"
    return render(request, template, {"form": form}, status=400 if form.errors else 200)
