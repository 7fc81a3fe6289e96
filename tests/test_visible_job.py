"""`access.visible_job`, the one-job look-up of a Stop and of every job API call, against
`access.visible_jobs`, the rule itself (SPEC §3 "visibility"): rows only, no Docker, no worker
(tests/test_permissions.py checks both through every page and route with jobs that ran)."""

from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AnonymousUser, Permission
from rest_framework.authtoken.models import Token

from jobs import access
from jobs.models import Workspace
from tests.helpers import api_client, submit_job

pytestmark = pytest.mark.django_db


def _user(name: str, *workspaces: Workspace, list_all: bool = False, superuser: bool = False, active: bool = True):
    user = get_user_model().objects.create_user(
        name, password=f"{name}-password", is_superuser=superuser, is_active=active
    )
    for workspace in workspaces:
        workspace.members.add(user)
    if list_all:
        user.user_permissions.add(Permission.objects.get(codename="list_all_jobs", content_type__app_label="jobs"))
    return get_user_model().objects.get(pk=user.pk)  # no permissions cached


@pytest.fixture
def cast(demo):
    team, elsewhere = demo.workspace, Workspace.objects.get(name="elsewhere")
    jobs = {
        "shared": submit_job(demo, name="shared"),
        "owner-private": submit_job(demo, name="owner-private", visibility="creator"),
        "member-private": submit_job(demo, name="member-private", created_by=demo.member, visibility="creator"),
        "foreign": submit_job(demo, name="foreign", workspace=elsewhere, created_by=demo.outsider),
        "foreign-private": submit_job(
            demo, name="foreign-private", workspace=elsewhere, created_by=demo.outsider, visibility="creator"
        ),
    }
    users = {
        "owner": demo.owner,
        "member": demo.member,
        "outsider": demo.outsider,
        "auditor": _user("auditor", team, list_all=True),
        "auditor elsewhere": _user("auditor-elsewhere", elsewhere, list_all=True),
        "member of both": _user("both", team, elsewhere),
        "superuser": _user("root", superuser=True),
        "inactive superuser": _user("old-root", superuser=True, active=False),
        "inactive member": _user("gone", team, active=False),
    }
    return demo, team, elsewhere, jobs, users


def test_visible_job_is_the_rule_of_visible_jobs_for_every_caller_and_job(cast):
    _demo, _team, _elsewhere, jobs, users = cast
    for role, user in users.items():
        visible = set(access.visible_jobs(user).values_list("id", flat=True))
        for name, job in jobs.items():
            found = access.visible_job(user, id=job.id)
            assert (found is not None) == (job.id in visible), (role, name)
            assert found is None or found.id == job.id
            assert access.may_see_job(user, job.id) == (job.id in visible), (role, name)
    for nobody in (None, AnonymousUser()):
        assert all(access.visible_job(nobody, id=job.id) is None for job in jobs.values())
        assert not any(access.may_see_job(nobody, job.id) for job in jobs.values())


def test_a_sockets_recheck_asks_once_for_a_job_it_may_see(cast, django_assert_num_queries):
    """A socket rechecks with its user read afresh: `visible_jobs(user).filter(...).exists()`
    asked for the account's permissions first (three queries); `may_see_job` asks once, and
    for the permissions only when the job is someone else's and creator-only."""
    _demo, _team, _elsewhere, jobs, users = cast
    member = get_user_model().objects.get(pk=users["member"].pk)
    with django_assert_num_queries(1):
        assert access.may_see_job(member, jobs["shared"].id)
    member = get_user_model().objects.get(pk=users["member"].pk)
    with django_assert_num_queries(3):  # what the sockets asked before
        assert access.visible_jobs(member).filter(id=jobs["shared"].id).exists()
    auditor = get_user_model().objects.get(pk=users["auditor"].pk)
    with django_assert_num_queries(3):  # the job, then the account's two permission look-ups
        assert access.may_see_job(auditor, jobs["owner-private"].id)


def test_a_job_is_found_through_its_own_project_only(cast):
    """A member of two workspaces reaches a job through its own project; through the other one it
    is a 404, worded as for a job that does not exist."""
    _demo, team, elsewhere, jobs, users = cast
    both, shared = users["member of both"], jobs["shared"]
    assert access.visible_job(both, workspace__project_id=team.project_id, id=shared.id) == shared
    assert access.visible_job(both, workspace__project_id=elsewhere.project_id, id=shared.id) is None
    client = api_client(Token.objects.create(user=both).key)
    assert client.get(f"/v2/{team.project_id}/training-jobs/{shared.id}").status_code == 200
    for project in (elsewhere.project_id, "no-such-project"):
        wrong = client.get(f"/v2/{project}/training-jobs/{shared.id}")
        assert wrong.status_code == 404
        assert wrong.json()["error_msg"] == "No such project or job."
