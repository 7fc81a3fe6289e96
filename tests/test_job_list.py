"""The job list (page, API list and its websocket): filter by phase, search by name, sort by creation
time or duration, pagination, restart counters, htmx partial swaps, and live rows over the real daphne,
Celery worker and Docker."""

from __future__ import annotations

import re
import time
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone
from rest_framework.test import APIClient

from jobs.models import Phase, TrainingJob
from jobs.views.list import PAGE_SIZE
from tests.helpers import BUSYBOX, api_client, submit_job, wait_for
from tests.wsclient import connect

# Transactional only for the live tests (their `live_url` brings the worker): the rest read rows written here.
pytestmark = [pytest.mark.django_db]

ROW = re.compile(r'id="job-row-([0-9a-f-]{36})" data-job="[^"]+" data-phase="([^"]+)"')
BASE = timezone.now().replace(microsecond=0) - timedelta(days=1)

# name, phase, minutes after BASE it was created, seconds it ran (None: never started)
CATALOG = [
    ("bert-small", Phase.COMPLETED, 0, 300),
    ("bert-large", Phase.FAILED, 1, 10),
    ("resnet-50", Phase.COMPLETED, 2, 3600),
    ("resnet-101", Phase.TERMINATED, 3, None),
    ("gpt-tiny", Phase.FAILED, 4, 60),
]


def finished_job(demo, name, phase, created_min, ran_s, **fields) -> TrainingJob:
    """A finished job written directly: the worker ignores final phases, so nothing changes under the test."""
    created = BASE + timedelta(minutes=created_min)
    started = created + timedelta(seconds=5) if ran_s is not None else None
    return TrainingJob.objects.create(
        workspace=demo.workspace,
        created_by=demo.owner,
        name=name,
        image=BUSYBOX,
        command="true",
        phase=phase,
        created_at=created,
        started_at=started,
        ended_at=started + timedelta(seconds=ran_s) if started else created + timedelta(seconds=1),
        **fields,
    )


@pytest.fixture
def catalog(demo) -> dict[str, TrainingJob]:
    return {name: finished_job(demo, name, *rest) for name, *rest in CATALOG}


def page_names(html: str, catalog) -> list[str]:
    by_id = {str(job.id): name for name, job in catalog.items()}
    return [by_id[job_id] for job_id, _ in ROW.findall(html)]


def api_names(items: list[dict]) -> list[str]:
    return [item["metadata"]["name"] for item in items]


@pytest.fixture
def site(demo) -> Client:
    """The pages, as the demo member's browser session asks for them (Django's test client)."""
    client = Client()
    client.force_login(demo.member)
    return client


@pytest.fixture
def api(demo) -> APIClient:
    return api_client(demo.token)


def list_url(demo) -> str:
    return f"/v2/{demo.workspace.project_id}/training-jobs"


# -- filters, search and sort: the page and the API agree ---------------------------------------------
QUERIES = [
    ({}, ["gpt-tiny", "resnet-101", "resnet-50", "bert-large", "bert-small"]),
    ({"order": "asc"}, ["bert-small", "bert-large", "resnet-50", "resnet-101", "gpt-tiny"]),
    ({"sort_by": "create_time", "order": "desc"}, ["gpt-tiny", "resnet-101", "resnet-50", "bert-large", "bert-small"]),
    # Duration: never started counts as zero (last descending, first ascending).
    ({"sort_by": "duration"}, ["resnet-50", "bert-small", "gpt-tiny", "bert-large", "resnet-101"]),
    ({"sort_by": "duration", "order": "asc"}, ["resnet-101", "bert-large", "gpt-tiny", "bert-small", "resnet-50"]),
    ({"phase": "Completed"}, ["resnet-50", "bert-small"]),
    ({"phase": "failed"}, ["gpt-tiny", "bert-large"]),  # case-insensitive
    ({"phase": "Failed,Terminated"}, ["gpt-tiny", "resnet-101", "bert-large"]),
    ({"phase": "Running"}, []),
    ({"name": "bert"}, ["bert-large", "bert-small"]),
    ({"name": "RESNET"}, ["resnet-101", "resnet-50"]),
    ({"name": "resnet", "phase": "Completed"}, ["resnet-50"]),
    ({"name": "net", "sort_by": "duration", "order": "asc"}, ["resnet-101", "resnet-50"]),
    ({"name": "nothing-like-this"}, []),
]


@pytest.mark.parametrize("params,expected", QUERIES, ids=[str(q) for q, _ in QUERIES])
def test_filters_search_and_sort_on_the_page_and_the_api(catalog, site, api, demo, params, expected):
    page = site.get("/", params)
    assert page.status_code == 200
    assert page_names(page.content.decode(), catalog) == expected
    listed = api.get(list_url(demo), params)
    assert listed.status_code == 200, listed.content
    body = listed.json()
    assert api_names(body["items"]) == expected
    assert body["count"] == len(expected)
    assert body["sort_by"] == params.get("sort_by", "create_time") and body["order"] == params.get("order", "desc")


def test_repeated_phase_parameters(catalog, api, demo, site):
    listed = api.get(f"{list_url(demo)}?phase=Completed&phase=Terminated").json()
    assert api_names(listed["items"]) == ["resnet-101", "resnet-50", "bert-small"]
    assert page_names(site.get("/?phase=Completed&phase=Terminated").content.decode(), catalog) == api_names(
        listed["items"]
    )


@pytest.mark.parametrize(
    "params,field",
    [({"phase": "Sleeping"}, "phase"), ({"sort_by": "name"}, "sort_by"), ({"order": "sideways"}, "order")],
)
def test_bad_parameters_are_refused_naming_them(catalog, api, site, demo, params, field):
    response = api.get(list_url(demo), params)
    assert response.status_code == 400
    error = response.json()
    assert error["error_msg"].startswith(f"{field}:") and field in error["errors"], error
    page = site.get("/", params)
    assert page.status_code == 200  # the page says so above the (unfiltered by that value) list
    assert 'role="alert"' in page.content.decode() and f"{field}:" in page.content.decode()


def test_the_form_shows_the_current_query(catalog, site):
    html = site.get("/", {"phase": "Failed", "name": "bert", "sort_by": "duration", "order": "asc"}).content.decode()
    assert '<option value="Failed" selected>' in html
    assert 'name="name" id="filter-name" value="bert"' in html
    assert '<option value="duration" selected>' in html
    assert '<option value="asc" selected>' in html
    assert "1 job matches the filters" in html


# -- pagination --------------------------------------------------------------------------------------------
def test_page_pagination_keeps_the_query(demo, site):
    jobs = {f"many-{i:02d}": finished_job(demo, f"many-{i:02d}", Phase.COMPLETED, 10 + i, i) for i in range(30)}
    finished_job(demo, "other", Phase.FAILED, 100, 1)
    first = site.get("/", {"phase": "Completed", "name": "many"}).content.decode()
    assert len(ROW.findall(first)) == PAGE_SIZE == 25
    assert page_names(first, jobs) == [f"many-{i:02d}" for i in range(29, 4, -1)]
    assert "Page 1 of 2" in first
    assert 'href="?phase=Completed&amp;name=many&amp;page=2"' in first
    second = site.get("/", {"phase": "Completed", "name": "many", "page": 2}).content.decode()
    assert page_names(second, jobs) == [f"many-{i:02d}" for i in range(4, -1, -1)]
    assert 'href="?phase=Completed&amp;name=many&amp;page=1"' in second
    # Sorted ascending by duration, page 2 holds the longest.
    longest = site.get("/", {"name": "many", "sort_by": "duration", "order": "asc", "page": 2}).content.decode()
    assert page_names(longest, jobs) == [f"many-{i:02d}" for i in range(25, 30)]
    # A page past the end shows the last one.
    assert page_names(site.get("/", {"name": "many", "page": 99}).content.decode(), jobs) == page_names(second, jobs)


def test_api_pagination(catalog, api, demo):
    body = api.get(list_url(demo), {"limit": 2, "offset": 1}).json()
    assert body["count"] == 5 and body["limit"] == 2 and body["offset"] == 1
    assert api_names(body["items"]) == ["resnet-101", "resnet-50"]
    body = api.get(list_url(demo), {"limit": 2, "offset": 4, "sort_by": "duration"}).json()
    assert api_names(body["items"]) == ["resnet-101"]


# -- htmx: one view, full page or the results only ------------------------------------------------------
def test_htmx_request_gets_only_the_results(catalog, site):
    full = site.get("/", {"phase": "Completed"}).content.decode()
    assert "<html" in full and 'id="job-filters"' in full and 'hx-target="#job-results"' in full
    partial = site.get("/", {"phase": "Completed"}, HTTP_HX_REQUEST="true").content.decode()
    assert partial.lstrip().startswith('<div id="job-results">')
    assert "<html" not in partial and 'id="job-filters"' not in partial
    assert page_names(partial, catalog) == ["resnet-50", "bert-small"]
    # Its websocket carries the same query, so the swap reconnects it with the new filters.
    assert 'ws-connect="/ws/jobs/?phase=Completed&amp;page=1"' in partial


def test_rows_show_restart_counters(demo, site):
    ha = finished_job(
        demo,
        "ha-job",
        Phase.FAILED,
        0,
        30,
        fault_tolerance=True,
        max_restarts=5,
        restarts_used=2,
        hang_restart=True,
        hang_restarts_used=1,
        pod_retry_num=2,
        reschedules_used=1,
    )
    plain = finished_job(demo, "plain-job", Phase.COMPLETED, 1, 30)
    html = site.get("/").content.decode()
    ha_row = row_html(html, ha)
    assert '<td class="num-restarts">2/5</td>' in ha_row
    assert '<td class="num-hang">1</td>' in ha_row
    assert '<td class="num-resched">1/2</td>' in ha_row
    assert "0:00:30" in ha_row  # duration
    assert 'title="Fault tolerance off">off</td>' in row_html(html, plain)


def row_html(html: str, job) -> str:
    start = html.index(f'id="job-row-{job.id}"')
    return html[start : html.index("</tr>", start)]


# -- live rows -------------------------------------------------------------------------------------------
def session_cookie(user) -> str:
    client = Client()
    client.force_login(user)
    return client.cookies["sessionid"].value


def open_list(live_url: str, user, query: str = ""):
    url = live_url.replace("http://", "ws://", 1) + "/ws/jobs/" + (f"?{query}" if query else "")
    headers = {"Origin": live_url, "Cookie": f"sessionid={session_cookie(user)}"}
    return connect(url, additional_headers=headers, open_timeout=10)


def row_phases(ws, job, until: str, timeout: float = 40) -> list[str]:
    """The phases the rows sent over `ws` show for `job`, until one shows `until`."""
    phases: list[str] = []
    rows = re.compile(rf'id="job-row-{job.id}" data-job="[^"]+" data-phase="([^"]+)"')
    deadline = time.monotonic() + timeout
    while not phases or phases[-1] != until:
        try:
            message = ws.recv(timeout=max(0.01, deadline - time.monotonic()))
        except TimeoutError:
            raise AssertionError(
                f"no list update showing {job.name} {until} within {timeout}s (saw {phases}): is "
                "jobs.listing.announce_change(job_id) called from jobs.runtime.lifecycle.announce?"
            ) from None
        assert message.startswith('<div id="job-rows" hx-swap-oob="true">'), message[:200]
        phases.extend(rows.findall(message))
    return phases


def drain(ws, quiet: float = 1.5) -> list[str]:
    messages = []
    while True:
        try:
            messages.append(ws.recv(timeout=quiet))
        except TimeoutError:
            return messages


def test_list_socket_shows_live_phases_of_visible_jobs_only(demo, live_url):
    with (
        open_list(live_url, demo.owner) as owner_ws,
        open_list(live_url, demo.member) as member_ws,
        open_list(live_url, demo.outsider) as outsider_ws,
        open_list(live_url, demo.owner, "name=shared") as filtered_ws,
    ):
        for ws in (owner_ws, member_ws, outsider_ws, filtered_ws):
            first = ws.recv(timeout=10)
            assert first.startswith('<div id="job-rows" hx-swap-oob="true">') and not ROW.findall(first)

        shared = submit_job(demo, name="live-shared", command="sleep 1; echo done", fault_tolerance=True)
        for ws in (owner_ws, member_ws, filtered_ws):
            phases = row_phases(ws, shared, "Completed")
            assert "Running" in phases and phases.index("Running") < phases.index("Completed"), phases
        for ws in (owner_ws, member_ws, filtered_ws):
            drain(ws)  # late changes of the shared job (counters, cleanup)
        assert drain(outsider_ws, quiet=0.5) == []  # another workspace: nothing at all

        hidden = submit_job(demo, name="live-hidden", command="sleep 1; echo done", visibility="creator")
        assert "Running" in row_phases(owner_ws, hidden, "Completed")
        # The member may not see it: not one message about it, nor for the outsider.
        assert drain(member_ws) == [], "the member's list socket received an update for a creator-only job"
        assert drain(outsider_ws, quiet=0.5) == []
        # The owner's socket filtered by name re-renders (the job is visible) but never shows it.
        for message in drain(filtered_ws, quiet=0.5):
            assert str(hidden.id) not in message and "live-hidden" not in message
            assert ROW.findall(message) == [(str(shared.id), "Completed")]

        # Deleting a job (API) takes its row off the lists that showed it.
        api = api_client(demo.token)
        assert api.delete(f"{list_url(demo)}/{shared.id}").status_code == 204
        for ws in (owner_ws, member_ws):
            message = ws.recv(timeout=10)
            assert message.startswith('<div id="job-rows"') and str(shared.id) not in message
    wait_for(lambda: TrainingJob.objects.get(id=hidden.id).phase == Phase.COMPLETED, message="Completed")


def test_list_socket_refuses_an_anonymous_caller(demo, live_url):
    from websockets.exceptions import ConnectionClosed, InvalidStatus

    url = live_url.replace("http://", "ws://", 1) + "/ws/jobs/"
    try:
        with connect(url, additional_headers={"Origin": live_url}, open_timeout=10) as ws:
            with pytest.raises(ConnectionClosed) as closed:
                ws.recv(timeout=10)
            assert closed.value.rcvd.code == 4403
    except InvalidStatus as exc:
        assert exc.response.status_code == 403
