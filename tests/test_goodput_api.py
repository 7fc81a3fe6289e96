"""Goodput in the API (status.goodput, and each recovery's cost in GET .../recoveries): the same
figures the Fault recovery tab shows, from the same computation (jobs/goodput.py). The pure
computation is tested by table in tests/test_goodput.py."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext

from faulttolerance.models import RecoveryRecord
from jobs.goodput import as_dict, job_goodput
from jobs.models import Attempt, Phase, TaskRun, TrainingJob
from tests.helpers import PYTHON_IMAGE, api_client, submit_job, wait_for

pytestmark = [pytest.mark.django_db]

GOODPUT_RE = re.compile(
    r'<b class="goodput-ratio">([\d.]+) %</b>\s*<span class="sub">(.+?) of (.+?) since the first start'
    r"(?:; (\d+) recover(?:y|ies) cost (.+?) \(downtime)?"
)
# A recovery row's last two cells: its downtime, then the time lost (and the work lost under it).
ROW_RE = re.compile(
    r'<td class="nowrap">([^<]*)</td>\s*<td class="nowrap time-lost">([^<]*)'
    r'(?:<div class="sub">work lost ([^<]*)</div>)?'
)


def job_url(demo, job) -> str:
    return f"/v2/{demo.workspace.project_id}/training-jobs/{job.id}"


def tab(demo, job) -> str:
    client = Client()
    client.force_login(demo.owner)
    response = client.get(f"/jobs/{job.id}/?tab=recovery")
    assert response.status_code == 200
    return response.content.decode()


def seconds(text: str) -> tuple[float, float]:
    """A duration as the tab writes it (jobs/views/detail.py _duration_text), and its precision."""
    if m := re.fullmatch(r"([\d.]+) s", text):
        return float(m.group(1)), 0.005
    if m := re.fullmatch(r"(\d+) min (\d+) s", text):
        return int(m.group(1)) * 60 + int(m.group(2)), 0.5
    m = re.fullmatch(r"(\d+) h (\d+) min", text)
    assert m, text
    return int(m.group(1)) * 3600 + int(m.group(2)) * 60, 30


def same(text: str, value: float) -> bool:
    """The tab's text and the API's number (rounded to 3 places) are the same figure."""
    shown, precision = seconds(text)
    return abs(shown - value) <= precision + 0.0005


def ended_job_with_recoveries(demo) -> TrainingJob:
    """Ran 1000 s; three recoveries: 12.5 s down + 31.5 s of work lost; 1 s down, no checkpoints
    reported; one that never ran again (10 s down to the end, 2 s of work lost)."""
    job = submit_job(demo, name="goodput", fault_tolerance=True, max_restarts=3)
    t0 = job.created_at + timedelta(seconds=5)
    TrainingJob.objects.filter(id=job.id).update(
        phase=Phase.FAILED, started_at=t0, ended_at=t0 + timedelta(seconds=1000), restarts_used=3
    )
    attempts = [
        Attempt.objects.create(job=job, number=n, state=Attempt.State.ENDED, outcome="failed") for n in (1, 2, 3)
    ]
    for attempt in attempts:
        TaskRun.objects.create(attempt=attempt, index=0, host=demo.host, container_name=f"c-{job.id}-{attempt.number}")
    for failed, detected, back, evidence in (
        (attempts[0], 100, 112.5, {"work_lost_s": 31.5, "work_lost_steps": 630}),
        (attempts[1], 200, 201, {}),
        (attempts[2], 990, None, {"work_lost_s": 2.0, "stacks": "x" * 1000}),
    ):
        RecoveryRecord.objects.create(
            job=job,
            failed_attempt=failed,
            next_attempt=None if back is None else attempts[failed.number],
            detected_at=t0 + timedelta(seconds=detected),
            running_again_at=None if back is None else t0 + timedelta(seconds=back),
            failure_class="transient",
            task_index=0,
            exit_code=137,
            evidence=evidence,
            restart=back is not None,
            level="container" if back is not None else "",
            decision="restart (container level): transient is retryable" if back else "end: max restarts used up",
            restarts_used_after=failed.number,
            max_restarts=3,
        )
    job.refresh_from_db()
    return job


def test_status_goodput_and_each_recovery_cost_match_the_tab(demo):
    job = ended_job_with_recoveries(demo)
    api = api_client(demo.token)
    status = api.get(job_url(demo, job)).json()["status"]
    assert status["goodput"] == {
        "effective_training_ratio": 0.943,
        "elapsed_s": 1000.0,
        "effective_s": 943.0,
        "lost_s": 57.0,
        "recoveries": 3,
    }
    items = api.get(f"{job_url(demo, job)}/recoveries").json()["items"]  # newest first, as on the tab
    assert [(r["downtime_s"], r["work_lost_s"], r["lost_s"]) for r in items] == [
        (None, 2.0, 12.0),  # never ran again: down until the job's end
        (1.0, None, 1.0),  # no checkpoints reported: the downtime only
        (12.5, 31.5, 44.0),
    ]

    html = tab(demo, job)
    assert GOODPUT_RE.search(html).groups() == ("94.3", "15 min 43 s", "16 min 40 s", "3", "57.00 s")
    assert ROW_RE.findall(html) == [
        ("–", "12.00 s", "2.00 s"),
        ("1.00 s", "1.00 s", ""),
        ("12.50 s", "44.00 s", "31.50 s"),
    ]


def test_the_list_shows_the_same_goodput_and_a_job_that_never_ran_none(demo):
    job = ended_job_with_recoveries(demo)
    pending = submit_job(demo, name="never-ran")
    api = api_client(demo.token)
    items = {i["metadata"]["id"]: i for i in api.get(f"/v2/{demo.workspace.project_id}/training-jobs").json()["items"]}
    assert items[str(job.id)]["status"]["goodput"] == api.get(job_url(demo, job)).json()["status"]["goodput"]
    assert items[str(job.id)]["status"]["goodput"]["lost_s"] == 57.0
    assert items[str(pending.id)]["status"]["goodput"] is None
    assert api.get(job_url(demo, pending)).json()["status"]["goodput"] is None


def test_the_list_reads_every_job_s_recoveries_in_one_query(demo):
    """status.goodput needs each job's recovery records: prefetched for the page, so the list's
    queries do not grow with the records (tests/test_job_list_queries.py: nor with the jobs)."""
    job = ended_job_with_recoveries(demo)
    api = api_client(demo.token)
    url = f"/v2/{demo.workspace.project_id}/training-jobs"

    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert api.get(url).status_code == 200
        return len(captured)

    before = queries()
    for n in range(5):
        RecoveryRecord.objects.create(
            job=job,
            failed_attempt=Attempt.objects.create(job=job, number=4 + n, state=Attempt.State.ENDED),
            detected_at=job.started_at + timedelta(seconds=300 + n),
            running_again_at=job.started_at + timedelta(seconds=300.5 + n),
            failure_class="transient",
            restart=True,
            decision="restart",
            restarts_used_after=1,
            max_restarts=3,
        )
    assert queries() == before
    assert api.get(url).json()["items"][0]["status"]["goodput"]["recoveries"] == 8


# -- a job with real recoveries ----------------------------------------------------------------------------
DEMO = "/opt/console/examples/train_checkpoint.py"


def progress_steps(run: TaskRun) -> int:
    from jobs.runtime.logs import read_lines

    run.refresh_from_db()
    return sum(1 for line in read_lines(run) if line.text.startswith("[progress] "))


@pytest.mark.django_db(transaction=True)
def test_a_killed_demo_job_shows_the_same_goodput_in_the_api_as_on_the_tab(demo, worker, docker_client):
    """The demo MLP, SIGKILLed from outside between two checkpoints: one recovery, with downtime and
    work lost since the checkpoint (the job's own log). Ended, its figures no longer change."""
    command = f"python3 {DEMO} --steps 80 --checkpoint-every 10 --sleep 0.05"
    job = submit_job(
        demo, name="goodput-demo", image=PYTHON_IMAGE, fault_tolerance=True, max_restarts=2, command=command
    )
    first = wait_for(
        lambda: (
            TaskRun.objects.filter(attempt__job=job, attempt__number=1, state=TaskRun.State.RUNNING)
            .exclude(container_id="")
            .first()
        ),
        message="the first container to run",
    )
    wait_for(lambda: progress_steps(first) >= 25, message="progress past two checkpoints")
    docker_client.containers.get(first.container_id).kill()
    wait_for(lambda: TrainingJob.objects.get(id=job.id).is_final, timeout=90, message="the job to end")
    job.refresh_from_db()
    assert job.phase == Phase.COMPLETED, job.phase_reason

    good = job_goodput(job)
    api = api_client(demo.token)
    status = api.get(job_url(demo, job)).json()["status"]
    assert status["goodput"] == as_dict(good)
    assert status["goodput"]["recoveries"] == 1 and 0 < status["goodput"]["effective_training_ratio"] < 1
    (item,) = api.get(f"{job_url(demo, job)}/recoveries").json()["items"]
    (cost,) = good.costs
    assert item["work_lost_s"] == pytest.approx(cost.work_lost_s, abs=0.0005) and item["work_lost_s"] > 0
    assert item["lost_s"] == pytest.approx(cost.lost_s, abs=0.0005)
    assert item["downtime_s"] == pytest.approx(cost.downtime_s) and item["downtime_s"] > 0
    assert item["lost_s"] == pytest.approx(item["downtime_s"] + item["work_lost_s"], abs=0.001)

    html = tab(demo, job)
    percent, effective, elapsed, recoveries, lost = GOODPUT_RE.search(html).groups()
    goodput = status["goodput"]
    assert abs(float(percent) - goodput["effective_training_ratio"] * 100) <= 0.05 + 0.005
    assert same(effective, goodput["effective_s"]) and same(elapsed, goodput["elapsed_s"])
    assert (int(recoveries), goodput["recoveries"]) == (1, 1) and same(lost, goodput["lost_s"])
    ((downtime, time_lost, work_lost),) = ROW_RE.findall(html)
    assert (
        same(downtime, item["downtime_s"]) and same(time_lost, item["lost_s"]) and same(work_lost, item["work_lost_s"])
    )


def test_the_schema_declares_what_the_api_returns(demo):
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    v2 = "/v2/{project_id}/training-jobs/{job_id}"
    job = schema["paths"][v2]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    goodput = job["properties"]["status"]["properties"]["goodput"]
    assert goodput["nullable"] is True and goodput["properties"]["effective_training_ratio"]["nullable"] is True
    returned = api_client(demo.token).get(job_url(demo, ended_job_with_recoveries(demo))).json()
    assert set(goodput["properties"]) == set(goodput["required"]) == set(returned["status"]["goodput"])
    recoveries = schema["paths"][f"{v2}/recoveries"]["get"]["responses"]["200"]["content"]["application/json"]
    record = recoveries["schema"]["properties"]["items"]["items"]["properties"]
    assert all(record[key]["nullable"] for key in ("downtime_s", "work_lost_s", "lost_s"))
