"""Who sees which job (SPEC §3 "visibility", §7 "every object is filtered by what the caller may see"),
the account quota (§3 "quota") and the high-priority permission (§3 "priority").

Five callers: the owner (creator of two jobs), a workspace member (creator of one creator-only job),
an outsider (member of another workspace), an auditor (workspace member holding "may list all jobs")
and a superuser; three jobs: the owner's workspace-visible and creator-only jobs and the member's
creator-only job. Every page, every API route and both job websockets (plus the list websocket) are
checked for each caller against the same table, through the real daphne, Celery worker and Docker.

The cast is made once for the module: its rows committed and its three jobs run to Completed by
the real worker. Each test then runs in a transaction that is rolled back (what it creates,
deletes or stops is gone for the next test), with fresh objects of the cast's rows. The quota, the
priority permission and Stop of a hidden running job are in test_permissions_quota.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
from django.contrib.auth import get_user_model
from django.test import Client
from rest_framework.test import APIClient
from websockets.exceptions import ConnectionClosed, InvalidStatus

from jobs import access
from jobs.models import DockerHost, Phase, ResourcePool, TrainingJob, Workspace
from jobs.views.detail import TABS
from tests.demo import make_demo
from tests.helpers import api_client, flush_database, phase, settle_jobs, submit_job, wait_for
from tests.permission_cast import api_as, api_body, create_form, grant, make_auditor, signed_in
from tests.wsclient import CLOSE_FORBIDDEN, connect

# Every test rolls back; the cast's rows are committed once for the module (`made_cast`).
pytestmark = [pytest.mark.django_db]

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
    sessions: dict  # role -> a committed session key (daphne sees only committed rows)

    def sees(self, role: str, key: str) -> bool:
        return key in SEES[role]


@pytest.fixture(scope="module")
def made_cast(django_db_setup, django_db_blocker, celery_worker_process, docker_client) -> Cast:
    """The cast, committed, its jobs run by the real worker to Completed; every row gone after."""
    with django_db_blocker.unblock():
        celery_worker_process.ensure_running()
        try:
            demo = make_demo()
            auditor = make_auditor(demo.workspace)
            superuser = get_user_model().objects.create_superuser("root", password="root-password")
            jobs = {
                "shared": submit_job(demo, name="shared-job", command="echo shared-output"),
                "owner_private": submit_job(
                    demo, name="owner-private-job", command="echo owner-secret", visibility="creator"
                ),
                "member_private": submit_job(
                    demo,
                    name="member-private-job",
                    command="echo member-secret",
                    created_by=demo.member,
                    visibility="creator",
                ),
            }
            for job in jobs.values():
                wait_for(lambda job=job: phase(job) == Phase.COMPLETED, message=f"{job.name} Completed")
            users = {
                "owner": demo.owner,
                "member": demo.member,
                "outsider": demo.outsider,
                "auditor": auditor,
                "superuser": superuser,
            }
            sessions = {role: signed_in(user).cookies["sessionid"].value for role, user in users.items()}
            yield Cast(demo, users, jobs, sessions)
        finally:
            try:
                settle_jobs(docker_client=docker_client)
            finally:
                flush_database()


@pytest.fixture
def cast(made_cast, db) -> Cast:
    """The module's cast with fresh objects of its rows: a test that changes one (in memory, or
    in its rolled-back transaction) leaves nothing behind for the next."""
    User = get_user_model()
    demo = SimpleNamespace(
        owner=User.objects.get(pk=made_cast.demo.owner.pk),
        member=User.objects.get(pk=made_cast.demo.member.pk),
        outsider=User.objects.get(pk=made_cast.demo.outsider.pk),
        workspace=Workspace.objects.get(pk=made_cast.demo.workspace.pk),
        host=DockerHost.objects.get(pk=made_cast.demo.host.pk),
        pool=ResourcePool.objects.get(pk=made_cast.demo.pool.pk),
    )
    users = {role: User.objects.get(pk=user.pk) for role, user in made_cast.users.items()}
    jobs = {key: TrainingJob.objects.get(pk=job.pk) for key, job in made_cast.jobs.items()}
    return Cast(demo, users, jobs, made_cast.sessions)


OUTPUT = {"shared": "shared-output", "owner_private": "owner-secret", "member_private": "member-secret"}


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


@pytest.mark.parametrize("role", ROLES)
def test_visible_job_follows_the_table(cast, role, django_assert_max_num_queries):
    """The one-job look-up (a Stop, every job API call) gives what the filter gives, job by job;
    a workspace-visible job or one's own costs one query, not the two of the permissions first."""
    user = cast.users[role]
    for job in cast.jobs.values():
        found = access.visible_job(user, id=job.id)
        assert (found is not None) == (str(job.id) in expected_ids(cast, role)), (role, job.name)
        assert found is None or found.id == job.id
    owner = get_user_model().objects.get(pk=cast.demo.owner.pk)  # no permissions cached
    with django_assert_max_num_queries(1):
        assert access.visible_job(owner, id=cast.jobs["shared"].id) is not None


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
    assert access.visible_job(auditor, id=foreign.id) is None
    assert access.visible_job(cast.users["superuser"], id=foreign.id) == foreign
    outsider = grant(cast.demo.outsider, "list_all_jobs")
    assert set(access.visible_jobs(outsider).values_list("id", flat=True)) == {foreign.id}
    assert access.visible_job(outsider, id=foreign.id) == foreign
    assert access.visible_job(outsider, id=cast.jobs["member_private"].id) is None


def test_anonymous_and_inactive_users_see_nothing(cast):
    from django.contrib.auth.models import AnonymousUser

    shared = cast.jobs["shared"].id
    assert not access.visible_jobs(AnonymousUser()).exists()
    assert not access.visible_jobs(None).exists()
    assert access.visible_job(AnonymousUser(), id=shared) is None
    assert access.visible_job(None, id=shared) is None
    member = cast.demo.member
    member.is_active = False
    member.save()
    assert not access.visible_jobs(member).exists()
    assert access.visible_job(member, id=shared) is None


# -- pages -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_pages(cast, role):
    client = signed_in(cast.users[role])
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


def test_anonymous_pages_go_to_the_login(cast):
    client = Client()
    job = cast.jobs["shared"]
    paths = ["/", "/jobs/create/", f"/jobs/{job.id}/", f"/jobs/{job.id}/logs/0/download/"]
    for path in paths:
        response = client.get(path)
        assert response.status_code == 302 and response["Location"].startswith("/accounts/login/"), path
    assert client.post(f"/jobs/{job.id}/stop/").status_code == 302
    assert phase(job) == Phase.COMPLETED


# -- API -------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("role", ROLES)
def test_api_routes(cast, role):
    api = api_as(cast.users[role])
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


def test_api_anonymous_and_bad_token_are_refused(cast):
    job = cast.jobs["shared"]
    for client in (APIClient(), api_client("not-a-token")):
        for path in (project(cast), f"{project(cast)}/{job.id}", f"{project(cast)}/{job.id}/events"):
            assert client.get(path).status_code in (401, 403), path
        assert client.post(project(cast), api_body("anon"), format="json").status_code in (401, 403)
        assert client.delete(f"{project(cast)}/{job.id}").status_code in (401, 403)
    assert TrainingJob.objects.filter(id=job.id).exists()


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
@pytest.fixture
def page_server(daphne_server) -> str:
    """The real daphne, without `live_url`'s transactional worker: it reads the cast's committed
    rows and sessions; what a test does in its own transaction it never sees."""
    daphne_server.ensure_running()
    return daphne_server.url


def ws_url(live_url: str, path: str) -> str:
    return live_url.replace("http://", "ws://", 1) + path


def first_message(live_url: str, path: str, session: str | None = None):
    """("message", text) or how the server refused: ("close", code) or ("http", status)."""
    headers = {"Origin": live_url}
    if session is not None:
        headers["Cookie"] = f"sessionid={session}"
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
def test_websockets(cast, page_server, role):
    live_url, session = page_server, cast.sessions[role]
    for key, job in cast.jobs.items():
        page = first_message(live_url, f"/ws/jobs/{job.id}/", session)
        log = first_message(live_url, f"/ws/jobs/{job.id}/logs/0/", session)
        if cast.sees(role, key):
            assert page[0] == "message" and 'id="job-header"' in page[1] and job.name in page[1], (role, key)
            assert log[0] == "message" and OUTPUT[key] in log[1], (role, key)
        else:
            assert page == ("close", CLOSE_FORBIDDEN), (role, key, page)
            assert log == ("close", CLOSE_FORBIDDEN), (role, key, log)
    # The job list's socket: its rows are the caller's visible jobs (none for the outsider).
    kind, html = first_message(live_url, "/ws/jobs/", session)
    assert kind == "message" and 'id="job-rows" hx-swap-oob="true"' in html
    assert listed_ids(html) == expected_ids(cast, role)
    for key, job in cast.jobs.items():
        if not cast.sees(role, key):
            assert job.name not in html


def test_anonymous_websockets_are_refused(cast, page_server):
    job = cast.jobs["shared"]
    for path in (f"/ws/jobs/{job.id}/", f"/ws/jobs/{job.id}/logs/0/", "/ws/jobs/"):
        how = first_message(page_server, path)
        assert how in (("http", 403), ("close", CLOSE_FORBIDDEN)), (path, how)
