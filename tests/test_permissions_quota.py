"""The account quota (SPEC §3 "quota": at most 10,000 jobs per account, the next refused with a
clear message on both paths), the high-priority permission (§3 "priority") and Stop of a running
job the caller may not see. Who sees which job is test_permissions.py."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.core.exceptions import ValidationError
from django.db import connection

from jobs import access
from jobs.models import Phase, TrainingJob
from tests.helpers import BUSYBOX, phase, submit_job, wait_for
from tests.permission_cast import api_as, api_body, create_form, grant, make_auditor, signed_in

pytestmark = [pytest.mark.django_db]


# -- Stop of a hidden running job -----------------------------------------------------------------------
def test_hidden_running_job_cannot_be_stopped(demo, worker):
    """A running creator-only job: the member's Stop (page, API) is a 404 and changes nothing; the auditor's works."""
    job = submit_job(demo, name="hidden-loop", command="while true; do sleep 0.2; done", visibility="creator")
    wait_for(lambda: phase(job) == Phase.RUNNING, message="Running")
    member = demo.member
    assert signed_in(member).post(f"/jobs/{job.id}/stop/").status_code == 404
    url = f"/v2/{demo.workspace.project_id}/training-jobs/{job.id}"
    assert api_as(member).post(f"{url}/actions", {"action_type": "terminate"}, format="json").status_code == 404
    assert api_as(member).delete(url).status_code == 404
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING and not job.terminate_requested
    assert signed_in(make_auditor(demo.workspace)).post(f"/jobs/{job.id}/stop/").status_code == 200
    wait_for(lambda: phase(job) == Phase.TERMINATED, message="Terminated")


# -- quota (SPEC §3: <= 10,000 jobs per account; the next is refused with a clear message) --------------
def fill_quota(demo, user, count: int) -> None:
    """`count` finished jobs of `user`, written directly (the worker has nothing to do with them):
    one made by the ORM, the rest copies of its row made by PostgreSQL in one statement (10,000
    model objects through bulk_create took seconds of each test)."""
    first = TrainingJob.objects.create(
        workspace=demo.workspace, created_by=user, name="old-0", image=BUSYBOX, command="true", phase=Phase.COMPLETED
    )
    if count == 1:
        return
    table = TrainingJob._meta.db_table
    columns = [f.column for f in TrainingJob._meta.concrete_fields if f.column not in ("id", "name")]
    copied = ", ".join(connection.ops.quote_name(c) for c in columns)
    with connection.cursor() as cursor:
        cursor.execute(
            f"INSERT INTO {table} (id, name, {copied}) "
            f"SELECT gen_random_uuid(), 'old-' || n, {copied} FROM {table}, generate_series(1, %s) AS n "
            f"WHERE id = %s",
            [count - 1, first.id],
        )


def test_check_quota_refuses_the_10001st_job(demo):
    assert access.JOB_QUOTA == 10_000
    fill_quota(demo, demo.owner, 9_999)
    access.check_quota(demo.owner)  # the 10,000th is allowed
    fill_quota(demo, demo.owner, 1)
    with pytest.raises(ValidationError) as refused:
        access.check_quota(demo.owner)
    assert refused.value.code == "quota"
    assert "10,000" in refused.value.messages[0]
    access.check_quota(demo.member)  # per account: the member is not affected


@pytest.mark.usefixtures("worker")  # the accepted jobs run
def test_api_refuses_the_10001st_job_of_an_account(demo):
    fill_quota(demo, demo.owner, 9_999)
    owner = api_as(demo.owner)
    url = f"/v2/{demo.workspace.project_id}/training-jobs"
    assert owner.post(url, api_body("the-10000th"), format="json").status_code == 201
    refused = owner.post(url, api_body("the-10001st"), format="json")
    assert refused.status_code == 400, refused.content
    error = refused.json()
    assert "10,000" in error["error_msg"] and error["errors"]["quota"], error
    assert not TrainingJob.objects.filter(name="the-10001st").exists()
    assert TrainingJob.objects.filter(created_by=demo.owner).count() == 10_000
    # Another account in the same workspace still creates.
    assert api_as(demo.member).post(url, api_body("members-job"), format="json").status_code == 201


def test_create_form_refuses_the_10001st_job_of_an_account(demo):
    fill_quota(demo, demo.owner, 10_000)
    client = signed_in(demo.owner)
    response = client.post("/jobs/create/", create_form(demo.workspace, "the-10001st"))
    assert response.status_code == 400, (
        "the create form accepted an account's 10,001st job: call jobs.access.check_quota(user) in "
        "JobCreateForm.clean() (see the report of the access work)"
    )
    assert "10,000" in response.content.decode()
    assert not TrainingJob.objects.filter(name="the-10001st").exists()


# -- priority 3 needs "may use high priority" --------------------------------------------------------------
def test_may_use_priority(demo):
    from django.contrib.auth.models import AnonymousUser

    member = demo.member
    for priority in (1, 2, "1", "2"):
        assert access.may_use_priority(member, priority)
    assert not access.may_use_priority(member, 3)
    assert not access.may_use_priority(member, "3")
    assert not access.may_use_priority(AnonymousUser(), 3)
    with pytest.raises(ValidationError) as refused:
        access.check_priority(member, 3)
    assert refused.value.code == "priority" and "may use high priority" in refused.value.messages[0]
    member = grant(member, "use_high_priority")
    assert access.may_use_priority(member, 3)
    access.check_priority(member, 3)
    root = get_user_model().objects.create_superuser("root", password="root-password")
    assert access.may_use_priority(root, 3)
    member.is_active = False
    assert not access.may_use_priority(member, 3)
