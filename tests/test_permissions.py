"""Who sees which job (SPEC §3 "visibility", §7 "every object is filtered by what the caller may see"),
the account quota (§3 "quota") and the high-priority permission (§3 "priority").

Five callers: the owner (creator of two jobs), a workspace member (creator of one creator-only job),
an outsider (member of another workspace), an auditor (workspace member holding "may list all jobs")
and a superuser; three jobs: the owner's workspace-visible and creator-only jobs and the member's
creator-only job. Every page, every API route and both job websockets (plus the list websocket) are
checked for each caller against the same table, through the real daphne, Celery worker and Docker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.core.exceptions import ValidationError
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import connect

from jobs import access
from jobs.models import Phase, TrainingJob
from jobs.views.detail import TABS
from tests.conftest import BUSYBOX, submit_job, wait_for

# The cast runs its jobs to completed: the worker (transactional); the quota and priority checks roll back.
pytestmark = [pytest.mark.django_db]

CLOSE_FORBIDDEN = 4403
ROLES = ("owner", "member", "outsider", "auditor", "superuser")
# Which of the three jobs each caller sees.
SEES = {
    "owner": {"shared", "owner_private"},
    "member": {"shared", "member_private"},
    "outsider": set(),
    "auditor": {"shared", "owner_private", "member_private"},
    "superuser": {"shared", "owner_private", "member_private"},
}
JOBS = ("shared", "owner_private", "member_private")


@dataclass
class Cast:
    demo: object
    users: dict
    jobs: dict  # key -> TrainingJob

    def sees(self, role: str, key: str) -> bool:
        return key in SEES[role]


def grant(user, codename: str):
    user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="jobs"))
    return get_user_model().objects.get(pk=user.pk)  # a fresh object: has_perm caches


@pytest.fixture
def cast(demo, worker) -> Cast:
    User = get_user_model()
    auditor = User.objects.create_user("auditor", password="auditor-password")
    demo.workspace.members.add(auditor)
    auditor = grant(auditor, "list_all_jobs")
    superuser = User.objects.create_superuser("root", password="root-password")
    jobs = {
        "shared": submit_job(demo, name="shared-job", command="echo shared-output"),
        "owner_private": submit_job(demo, name="owner-private-job", command="echo owner-secret", visibility="creator"),
        "member_private": submit_job(
            demo, name="member-private-job", command="echo member-secret", created_by=demo.member, visibility="creator"
        ),
    }
    for job in jobs.values():
        wait_for(lambda job=job: _phase(job) == Phase.COMPLETED, message=f"{job.name} Completed")
    users = {
        "owner": demo.owner,
        "member": demo.member,
        "outsider": demo.outsider,
        "auditor": auditor,
        "superuser": superuser,
    }
    return Cast(demo, users, jobs)


def _phase(job) -> str:
    job.refresh_from_db()
    return job.phase


OUTPUT = {"shared": "shared-output", "owner_private": "owner-secret", "member_private": "member-secret"}


def browser(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def api_client(user) -> APIClient:
    client = APIClient()
    token, _ = Token.objects.get_or_create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


def project(cast) -> str:
    return f"/v2/{cast.demo.workspace.project_id}/training-jobs"


def listed_ids(html: str) -> set[str]:
    return set(re.findall(r'id="job-row-([0-9a-f-]{36})"', html))


def rows_part(html: str) -> str:
    return html[html.index('id="job-rows"') :]


def expected_ids(cast, role) -> set[str]:
    return {str(cast.jobs[key].id) for key in SEES[role]}


# -- the visibility rule itself ------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_visible_jobs_follows_the_table(cast, role):
    visible = set(access.visible_jobs(cast.users[role]).values_list("id", flat=True))
    assert {str(pk) for pk in visible} == expected_ids(cast, role)


def test_list_all_jobs_stays_within_the_holders_workspaces(cast):
    """ "May list all jobs" shows creator-only jobs of the holder's workspaces, not of other workspaces."""
    elsewhere = cast.demo.outsider.workspaces.get()
    foreign = submit_job(
        cast.demo, name="foreign-private", workspace=elsewhere, created_by=cast.demo.outsider, visibility="creator"
    )
    auditor = cast.users["auditor"]
    assert not access.visible_jobs(auditor).filter(id=foreign.id).exists()
    assert access.visible_jobs(cast.users["superuser"]).filter(id=foreign.id).exists()
    # The outsider holding the permission sees it in their own workspace, still nothing of "team".
    outsider = grant(cast.demo.outsider, "list_all_jobs")
    assert set(access.visible_jobs(outsider).values_list("id", flat=True)) == {foreign.id}


def test_anonymous_and_inactive_users_see_nothing(cast):
    from django.contrib.auth.models import AnonymousUser

    assert not access.visible_jobs(AnonymousUser()).exists()
    assert not access.visible_jobs(None).exists()
    member = cast.demo.member
    member.is_active = False
    member.save()
    assert not access.visible_jobs(member).exists()


# -- pages -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_pages(cast, role):
    client = browser(cast.users[role])
    # The job list (full page and the htmx partial), also when searching for a hidden job by name.
    for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
        response = client.get("/", **headers)
        assert response.status_code == 200
        assert listed_ids(response.content.decode()) == expected_ids(cast, role)
    for key, job in cast.jobs.items():
        found = client.get("/", {"name": job.name}).content.decode()
        assert (str(job.id) in listed_ids(found)) == cast.sees(role, key), (role, key)
        if not cast.sees(role, key):
            assert job.name not in rows_part(found)  # (the search box echoes the name)
    # Every tab of the job page (full page and the htmx tab partial), the log download and Stop.
    for key, job in cast.jobs.items():
        want = 200 if cast.sees(role, key) else 404
        for tab in (t for t in TABS if t != "metrics" or job.metrics_mode):  # only jobs with metrics have the tab
            for headers in ({}, {"HTTP_HX_REQUEST": "true"}):
                response = client.get(f"/jobs/{job.id}/", {"tab": tab}, **headers)
                assert response.status_code == want, (role, key, tab, headers)
                if want == 404:
                    assert job.name.encode() not in response.content
        download = client.get(f"/jobs/{job.id}/logs/0/download/")
        assert download.status_code == want, (role, key)
        body = b"".join(download.streaming_content) if want == 200 else download.content
        assert (OUTPUT[key].encode() in body) == (want == 200)
        assert client.post(f"/jobs/{job.id}/stop/").status_code == want, (role, key)
    # The create page: anyone signed in gets the form; only members can create in the workspace.
    assert client.get("/jobs/create/").status_code == 200
    before = TrainingJob.objects.count()
    response = client.post("/jobs/create/", create_form(cast.demo.workspace, f"created-by-{role}"))
    if role == "outsider":
        assert response.status_code == 400
        assert "workspace" in response.context["form"].errors
        assert TrainingJob.objects.count() == before
    else:
        assert response.status_code == 302, response.content[:2000]
        assert TrainingJob.objects.filter(name=f"created-by-{role}", created_by=cast.users[role]).exists()


def create_form(workspace, name: str, **extra) -> dict:
    return {
        "workspace": workspace.id,
        "name": name,
        "image": BUSYBOX,
        "command": "echo created",
        "node_count": 1,
        "max_restarts": 3,
        "pod_retry_num": 0,
        **extra,
    }


def test_anonymous_pages_go_to_the_login(cast):
    client = Client()
    job = cast.jobs["shared"]
    paths = ["/", "/jobs/create/", f"/jobs/{job.id}/", f"/jobs/{job.id}/logs/0/download/"]
    for path in paths:
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), path
    assert client.post(f"/jobs/{job.id}/stop/").status_code == 302
    assert _phase(job) == Phase.COMPLETED


def test_hidden_running_job_cannot_be_stopped(cast):
    """A running creator-only job: the member's Stop (page, API) is a 404 and changes nothing; the auditor's works."""
    job = submit_job(cast.demo, name="hidden-loop", command="while true; do sleep 0.2; done", visibility="creator")
    wait_for(lambda: _phase(job) == Phase.RUNNING, message="Running")
    member = cast.users["member"]
    assert browser(member).post(f"/jobs/{job.id}/stop/").status_code == 404
    url = f"{project(cast)}/{job.id}"
    assert api_client(member).post(f"{url}/actions", {"action_type": "terminate"}, format="json").status_code == 404
    assert api_client(member).delete(url).status_code == 404
    job.refresh_from_db()
    assert job.phase == Phase.RUNNING and not job.terminate_requested
    assert browser(cast.users["auditor"]).post(f"/jobs/{job.id}/stop/").status_code == 200
    wait_for(lambda: _phase(job) == Phase.TERMINATED, message="Terminated")


# -- API -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_api_routes(cast, role):
    api = api_client(cast.users[role])
    listing = api.get(project(cast))
    if role == "outsider":
        assert listing.status_code == 404
    else:
        assert listing.status_code == 200
        assert {item["metadata"]["id"] for item in listing.json()["items"]} == expected_ids(cast, role)
        assert listing.json()["count"] == len(SEES[role])
        for key, job in cast.jobs.items():
            named = api.get(project(cast), {"name": job.name}).json()
            assert named["count"] == (1 if cast.sees(role, key) else 0), (role, key)
    for key, job in cast.jobs.items():
        url = f"{project(cast)}/{job.id}"
        sees = cast.sees(role, key)
        want = 200 if sees else 404
        detail = api.get(url)
        assert detail.status_code == want, (role, key)
        if sees:
            assert detail.json()["metadata"]["id"] == str(job.id)
        else:
            assert job.name not in detail.content.decode()
        assert api.get(f"{url}/events").status_code == want
        assert api.get(f"{url}/recoveries").status_code == want
        logs = api.get(f"{url}/tasks/worker-0/logs")
        assert logs.status_code == want
        if sees:
            assert OUTPUT[key] in b"".join(logs.streaming_content).decode()
        # Terminate on a finished job is accepted (nothing to do) only where the job is visible.
        action = api.post(f"{url}/actions", {"action_type": "terminate"}, format="json")
        assert action.status_code == (202 if sees else 404)
    created = api.post(project(cast), api_body(f"api-{role}"), format="json")
    assert created.status_code == (404 if role == "outsider" else 201), created.content
    # Delete last: a visible finished job goes (204), a hidden one is a 404 and stays.
    for key, job in cast.jobs.items():
        response = api.delete(f"{project(cast)}/{job.id}")
        assert response.status_code == (204 if cast.sees(role, key) else 404), (role, key)
        assert TrainingJob.objects.filter(id=job.id).exists() != cast.sees(role, key)


def api_body(name: str, **spec) -> dict:
    return {
        "kind": "job",
        "metadata": {"name": name, "annotations": {}},
        "algorithm": {"command": "echo api", "engine": {"image_url": BUSYBOX}},
        "spec": {"resource": {"node_count": 1}, **spec},
    }


def test_api_anonymous_and_bad_token_are_refused(cast):
    job = cast.jobs["shared"]
    for client in (APIClient(), _with_token("not-a-token")):
        for path in (project(cast), f"{project(cast)}/{job.id}", f"{project(cast)}/{job.id}/events"):
            assert client.get(path).status_code in (401, 403), path
        assert client.post(project(cast), api_body("anon"), format="json").status_code in (401, 403)
        assert client.delete(f"{project(cast)}/{job.id}").status_code in (401, 403)
    assert TrainingJob.objects.filter(id=job.id).exists()


def _with_token(key: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    return client


def test_api_session_auth_for_the_browser_with_csrf(cast):
    """The browser's session works for the API; its unsafe methods need the CSRF token."""
    client = Client(enforce_csrf_checks=True)
    client.force_login(cast.demo.member)
    listing = client.get(project(cast))
    assert listing.status_code == 200
    assert {i["metadata"]["id"] for i in listing.json()["items"]} == expected_ids(cast, "member")
    refused = client.post(project(cast), api_body("no-csrf"), content_type="application/json")
    assert refused.status_code == 403
    assert not TrainingJob.objects.filter(name="no-csrf").exists()
    client.get("/")  # sets the csrftoken cookie
    token = client.cookies["csrftoken"].value
    accepted = client.post(
        project(cast), api_body("with-csrf"), content_type="application/json", HTTP_X_CSRFTOKEN=token
    )
    assert accepted.status_code == 201, accepted.content


# -- websockets ------------------------------------------------------------------------------------------
def session_cookie(user) -> str:
    return browser(user).cookies["sessionid"].value


def ws_url(live_url: str, path: str) -> str:
    return live_url.replace("http://", "ws://", 1) + path


def first_message(live_url: str, path: str, user=None):
    """("message", text) or how the server refused: ("close", code) or ("http", status)."""
    headers = {"Origin": live_url}
    if user is not None:
        headers["Cookie"] = f"sessionid={session_cookie(user)}"
    try:
        ws = connect(ws_url(live_url, path), additional_headers=headers, open_timeout=10)
    except InvalidStatus as exc:
        return ("http", exc.response.status_code)
    with ws:
        try:
            return ("message", ws.recv(timeout=10))
        except ConnectionClosed as exc:
            return ("close", exc.rcvd.code if exc.rcvd else None)


@pytest.mark.parametrize("role", ROLES)
def test_websockets(cast, live_url, role):
    user = cast.users[role]
    for key, job in cast.jobs.items():
        page = first_message(live_url, f"/ws/jobs/{job.id}/", user)
        log = first_message(live_url, f"/ws/jobs/{job.id}/logs/0/", user)
        if cast.sees(role, key):
            assert page[0] == "message" and 'id="job-header"' in page[1] and job.name in page[1], (role, key)
            assert log[0] == "message" and OUTPUT[key] in log[1], (role, key)
        else:
            assert page == ("close", CLOSE_FORBIDDEN), (role, key, page)
            assert log == ("close", CLOSE_FORBIDDEN), (role, key, log)
    # The job list's socket: its rows are the caller's visible jobs (none for the outsider).
    kind, html = first_message(live_url, "/ws/jobs/", user)
    assert kind == "message" and 'id="job-rows" hx-swap-oob="true"' in html
    assert listed_ids(html) == expected_ids(cast, role)
    for key, job in cast.jobs.items():
        if not cast.sees(role, key):
            assert job.name not in html


def test_anonymous_websockets_are_refused(cast, live_url):
    job = cast.jobs["shared"]
    for path in (f"/ws/jobs/{job.id}/", f"/ws/jobs/{job.id}/logs/0/", "/ws/jobs/"):
        how = first_message(live_url, path)
        assert how in (("http", 403), ("close", CLOSE_FORBIDDEN)), (path, how)


# -- quota (SPEC §3: <= 10,000 jobs per account; the next is refused with a clear message) --------------
def fill_quota(demo, user, count: int) -> None:
    """`count` finished jobs of `user`, written directly (the worker has nothing to do with them)."""
    TrainingJob.objects.bulk_create(
        [
            TrainingJob(
                workspace=demo.workspace,
                created_by=user,
                name=f"old-{i}",
                image=BUSYBOX,
                command="true",
                phase=Phase.COMPLETED,
            )
            for i in range(count)
        ],
        batch_size=2000,
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
    owner = api_client(demo.owner)
    url = f"/v2/{demo.workspace.project_id}/training-jobs"
    assert owner.post(url, api_body("the-10000th"), format="json").status_code == 201
    refused = owner.post(url, api_body("the-10001st"), format="json")
    assert refused.status_code == 400, refused.content
    error = refused.json()
    assert "10,000" in error["error_msg"] and error["errors"]["quota"], error
    assert not TrainingJob.objects.filter(name="the-10001st").exists()
    assert TrainingJob.objects.filter(created_by=demo.owner).count() == 10_000
    # Another account in the same workspace still creates.
    assert api_client(demo.member).post(url, api_body("members-job"), format="json").status_code == 201


def test_create_form_refuses_the_10001st_job_of_an_account(demo):
    fill_quota(demo, demo.owner, 10_000)
    client = browser(demo.owner)
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
