"""The REST API of SPEC §7 through DRF's APIClient with token auth, against the real
database; jobs that must run use the real Celery worker and Docker."""

from __future__ import annotations

import copy
import logging
import socket
import time
from contextlib import contextmanager

import pytest
from rest_framework.test import APIClient

from jobs.models import Phase, TaskRun, TrainingJob
from tests.helpers import BUSYBOX, api_client, job_container, submit_job, wait_for

# Refusals create nothing and roll back; a test that creates a job runs it: the worker (transactional).
pytestmark = [pytest.mark.django_db]
runs_jobs = pytest.mark.usefixtures("worker")

RETRY = "fault-tolerance/job-retry-num"
UNCONDITIONAL = "fault-tolerance/job-unconditional-retry"
HANG = "fault-tolerance/hang-retry"
POD_RETRY = "fault-tolerance/pod-retry-num"

BODY = {
    "kind": "job",
    "metadata": {"name": "api-job", "description": "from the API", "annotations": {}},
    "algorithm": {
        "command": "echo hello from $MA_JOB_NAME; echo bye",
        "engine": {"image_url": BUSYBOX},
        "code_dir": None,
        "local_code_dir": None,
        "environments": {},
        "inputs": [],
        "outputs": [],
    },
    "spec": {
        "resource": {"flavor_id": None, "node_count": 1, "pool_id": None},
        "volumes": [],
        "log_export_path": None,
        "schedule_policy": {"priority": 1, "preemptible": False},
    },
}


def body(name: str = "api-job", command: str | None = None, annotations: dict | None = None, **paths) -> dict:
    """The §7 body; paths like image_url="x" set algorithm.engine.image_url, "drop" removes a key."""
    data = copy.deepcopy(BODY)
    data["metadata"]["name"] = name
    if command is not None:
        data["algorithm"]["command"] = command
    if annotations is not None:
        data["metadata"]["annotations"] = annotations
    for key, value in paths.items():
        if key == "image_url":
            data["algorithm"]["engine"]["image_url"] = value
        elif key == "node_count":
            data["spec"]["resource"]["node_count"] = value
        elif key == "drop_command":
            del data["algorithm"]["command"]
        else:
            raise KeyError(key)
    return data


def client_for(token: str | None) -> APIClient:
    return api_client(token) if token else APIClient()


@pytest.fixture
def api(demo) -> APIClient:
    return client_for(demo.token)


def jobs_url(demo) -> str:
    return f"/v2/{demo.workspace.project_id}/training-jobs"


def job_url(demo, job_id) -> str:
    return f"{jobs_url(demo)}/{job_id}"


def create(api, demo, data: dict) -> dict:
    response = api.post(jobs_url(demo), data, format="json")
    assert response.status_code == 201, response.content
    return response.json()


def get_status(api, demo, job_id) -> dict:
    response = api.get(job_url(demo, job_id))
    assert response.status_code == 200, response.content
    return response.json()["status"]


def wait_phase(api, demo, job_id, phase: str, timeout: float = 30) -> dict:
    return wait_for(
        lambda: (s := get_status(api, demo, job_id))["phase"] == phase and s,
        timeout=timeout,
        message=f"phase {phase}",
    )


def user_lines(text: str) -> list[str]:
    """The job's own output: without the platform's environment-check and launcher lines."""
    return [line for line in text.splitlines() if not line.startswith(("[env-check]", "[console]"))]


def job_containers(docker_client, job_id, all_: bool = False):
    # sparse: a full list inspects each container and fails on one removed meanwhile.
    return docker_client.containers.list(all=all_, sparse=True, filters={"label": f"console.job={job_id}"})


# -- create and run ---------------------------------------------------------------------------------
def test_created_job_runs_to_completed_with_its_ha_settings(demo, api, worker):
    created = create(api, demo, body(annotations={RETRY: "5", HANG: "true", UNCONDITIONAL: "false"}))
    job_id = created["metadata"]["id"]
    assert created["metadata"]["name"] == "api-job"
    assert created["status"]["phase"] in ("Pending", "Running", "Completed")
    assert created["status"]["max_restarts"] == 5

    status = wait_phase(api, demo, job_id, "Completed")
    assert status["restarts_used"] == 0
    assert status["max_restarts"] == 5
    assert status["hang_restarts_used"] == 0
    assert status["start_time"] is not None

    job = api.get(job_url(demo, job_id)).json()
    assert job["metadata"]["annotations"][RETRY] == "5"
    assert job["metadata"]["annotations"][HANG] == "true"
    assert job["metadata"]["annotations"][UNCONDITIONAL] == "false"
    assert job["algorithm"]["engine"]["image_url"] == BUSYBOX

    logs = api.get(f"{job_url(demo, job_id)}/tasks/worker-0/logs")
    assert logs.status_code == 200
    text = b"".join(logs.streaming_content).decode()
    assert user_lines(text) == ["hello from api-job", "bye"]
    # R > 0: the pre-flight environment checks ran, one "item" line each (SPEC §5).
    assert any("item" in line and "dns" in line for line in text.splitlines()), text

    listed = api.get(jobs_url(demo)).json()
    assert listed["count"] == 1 and listed["items"][0]["metadata"]["id"] == job_id


@pytest.mark.parametrize(
    "annotations,fault_tolerance,max_restarts",
    [
        pytest.param({RETRY: "128"}, True, 128, id="128"),
        pytest.param({RETRY: "1"}, True, 1, id="1"),
        pytest.param({}, False, 0, id="absent-off"),
    ],
)
@runs_jobs
def test_retry_num_limits_accepted(demo, api, annotations, fault_tolerance, max_restarts):
    created = create(api, demo, body(annotations=annotations))
    assert created["status"]["max_restarts"] == max_restarts
    job = TrainingJob.objects.get(id=created["metadata"]["id"])
    assert job.fault_tolerance is fault_tolerance
    assert job.max_restarts_effective == max_restarts
    if not fault_tolerance:
        assert created["metadata"]["annotations"] == {}


@runs_jobs
def test_name_of_64_chars_is_accepted(demo, api):
    created = create(api, demo, body(name="n" * 64))
    assert created["metadata"]["name"] == "n" * 64


# -- bad input -------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "data,path,limit",
    [
        pytest.param(body(name="bad name!"), "metadata.name", "64", id="name-chars"),
        pytest.param(body(name="名字"), "metadata.name", "64", id="name-cjk"),
        pytest.param(body(name="n" * 65), "metadata.name", "64", id="name-65"),
        pytest.param(body(name=""), "metadata.name", "", id="name-empty"),
        pytest.param(body(drop_command=True), "algorithm.command", "required", id="command-missing"),
        pytest.param(body(command="   "), "algorithm.command", "required", id="command-blank"),
        pytest.param(body(image_url="UPPER/Case::x"), "algorithm.engine.image_url", "image reference", id="image"),
        pytest.param(body(image_url=""), "algorithm.engine.image_url", "", id="image-empty"),
        pytest.param(body(annotations={RETRY: "129"}), f"metadata.annotations.{RETRY}", "128", id="retry-129"),
        # Present, the annotation is 1-128 (seed 000): "0" is refused as the wizard refuses it, not read as off.
        pytest.param(body(annotations={RETRY: "0"}), f"metadata.annotations.{RETRY}", "128", id="retry-0"),
        pytest.param(body(annotations={RETRY: "-1"}), f"metadata.annotations.{RETRY}", "128", id="retry-neg"),
        pytest.param(body(annotations={RETRY: "abc"}), f"metadata.annotations.{RETRY}", "128", id="retry-abc"),
        pytest.param(
            body(annotations={RETRY: "3", HANG: "maybe"}), f"metadata.annotations.{HANG}", '"true"', id="hang"
        ),
        pytest.param(
            body(annotations={RETRY: "3", UNCONDITIONAL: "yes"}),
            f"metadata.annotations.{UNCONDITIONAL}",
            '"true"',
            id="unconditional",
        ),
        pytest.param(
            body(annotations={RETRY: "3", POD_RETRY: "129"}), f"metadata.annotations.{POD_RETRY}", "128", id="pod-129"
        ),
        pytest.param(body(node_count=0), "spec.resource.node_count", "64", id="node-count-0"),
        pytest.param(body(node_count="two"), "spec.resource.node_count", "64", id="node-count-text"),
        pytest.param(
            body(annotations={HANG: "true"}), f"metadata.annotations.{RETRY}", "fault tolerance", id="hang-without-ft"
        ),
    ],
)
def test_bad_input_is_refused_naming_the_field_and_creates_nothing(demo, api, data, path, limit):
    before = TrainingJob.objects.count()
    response = api.post(jobs_url(demo), data, format="json")
    assert response.status_code == 400, response.content
    payload = response.json()
    assert path in payload["errors"], payload
    message = " ".join(payload["errors"][path])
    assert limit.lower() in message.lower(), message
    assert payload["error_msg"].startswith(path) or path in payload["error_msg"]
    assert TrainingJob.objects.count() == before


def test_body_that_is_not_an_object_is_refused(demo, api):
    response = api.post(jobs_url(demo), [1, 2], format="json")
    assert response.status_code == 400
    assert TrainingJob.objects.count() == 0


# -- who may see what --------------------------------------------------------------------------------
@runs_jobs
def test_outsider_gets_404_for_the_project_and_the_job(demo, api):
    job_id = create(api, demo, body())["metadata"]["id"]
    outsider = client_for(demo.outsider_token)
    assert outsider.get(jobs_url(demo)).status_code == 404
    assert outsider.get(job_url(demo, job_id)).status_code == 404
    assert outsider.get(f"{job_url(demo, job_id)}/recoveries").status_code == 404
    assert outsider.get(f"{job_url(demo, job_id)}/tasks/worker-0/logs").status_code == 404
    assert (
        outsider.post(f"{job_url(demo, job_id)}/actions", {"action_type": "terminate"}, format="json").status_code
        == 404
    )
    assert outsider.delete(job_url(demo, job_id)).status_code == 404
    assert outsider.post(jobs_url(demo), body(name="intruder"), format="json").status_code == 404
    # Through the outsider's own project the job is not reachable either.
    own_project = demo.outsider.workspaces.get().project_id
    assert outsider.get(f"/v2/{own_project}/training-jobs/{job_id}").status_code == 404
    assert outsider.get(f"/v2/{own_project}/training-jobs").json()["count"] == 0
    assert TrainingJob.objects.filter(name="intruder").count() == 0
    assert TrainingJob.objects.get(id=job_id).terminate_requested is False


def test_a_stop_request_asks_the_database_six_times(demo, api, django_assert_max_num_queries):
    """The Stop's request: the token, the job (the caller's membership and the job's visibility in
    the same query), the UPDATE (in a savepoint here: the test's transaction), the job again for
    the answer. It was 12: the workspace, the account's permissions, the job reloaded piecewise."""
    job = submit_job(demo, name="to-stop")
    TrainingJob.objects.filter(id=job.id).update(phase=Phase.RUNNING)
    with django_assert_max_num_queries(6):
        response = api.post(f"{job_url(demo, job.id)}/actions", {"action_type": "terminate"}, format="json")
    assert response.status_code == 202
    assert response.json()["status"]["phase"] == Phase.TERMINATING
    assert TrainingJob.objects.get(id=job.id).terminate_requested


@runs_jobs
def test_no_token_is_refused(demo, api):
    job_id = create(api, demo, body())["metadata"]["id"]
    anonymous = client_for(None)
    assert anonymous.get(jobs_url(demo)).status_code in (401, 403)
    assert anonymous.get(job_url(demo, job_id)).status_code in (401, 403)
    assert anonymous.post(jobs_url(demo), body(name="anon"), format="json").status_code in (401, 403)
    assert client_for("not-a-token").get(job_url(demo, job_id)).status_code in (401, 403)
    assert TrainingJob.objects.count() == 1


# -- actions and delete --------------------------------------------------------------------------------
LOOP = "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.1; done"


def test_terminate_action_ends_terminated_with_the_container_gone(demo, api, worker, docker_client):
    job_id = create(api, demo, body(command=LOOP, annotations={RETRY: "3"}))["metadata"]["id"]
    wait_phase(api, demo, job_id, "Running")
    container = wait_for(lambda: job_container(docker_client, job_id), message="container")

    response = api.post(f"{job_url(demo, job_id)}/actions", {"action_type": "terminate"}, format="json")
    assert response.status_code in (200, 202)
    assert response.json()["status"]["phase"] in ("Terminating", "Terminated")

    status = wait_phase(api, demo, job_id, "Terminated")
    assert status["restarts_used"] == 0
    # Removed once its log is drained, which may be a moment after the phase (docs/decisions.md "Stop").
    wait_for(
        lambda: not docker_client.containers.list(all=True, sparse=True, filters={"id": container.id}),
        message="the container removed",
    )
    assert api.get(f"{job_url(demo, job_id)}/recoveries").json()["count"] == 0


@pytest.mark.parametrize("delay", [0, 0.05, 0.1, 0.2, 0.4])
@runs_jobs
def test_terminate_at_any_moment_of_the_start_ends_terminated(demo, api, docker_client, delay):
    """A stop that lands before scheduling, while the containers start, or just after, ends the job."""
    ids = []
    for n in range(3):
        ids.append(create(api, demo, body(name=f"stop-{n}", command=LOOP))["metadata"]["id"])
        time.sleep(delay)  # not an assertion: moves where the stop lands in the start sequence
        response = api.post(f"{job_url(demo, ids[-1])}/actions", {"action_type": "terminate"}, format="json")
        assert response.status_code in (200, 202)
    for job_id in ids:
        wait_phase(api, demo, job_id, "Terminated")
        wait_for(lambda: not job_containers(docker_client, job_id, all_=True), message="its containers removed")
        job = TrainingJob.objects.get(id=job_id)
        assert not TaskRun.objects.filter(attempt__job=job, state=TaskRun.State.RUNNING).exists()
        assert job.restarts_used == 0 and job.attempts.count() <= 1


@runs_jobs
def test_unknown_action_is_refused(demo, api):
    job_id = create(api, demo, body())["metadata"]["id"]
    response = api.post(f"{job_url(demo, job_id)}/actions", {"action_type": "explode"}, format="json")
    assert response.status_code == 400
    assert "action_type" in response.json()["errors"]


def test_delete_running_job_is_409_and_finished_job_is_204(demo, api, worker, docker_client):
    running = create(api, demo, body(name="running", command=LOOP))["metadata"]["id"]
    finished = create(api, demo, body(name="finished", command="echo done"))["metadata"]["id"]
    wait_phase(api, demo, running, "Running")
    wait_phase(api, demo, finished, "Completed")

    response = api.delete(job_url(demo, running))
    assert response.status_code == 409
    assert "terminate" in response.json()["error_msg"].lower()
    assert get_status(api, demo, running)["phase"] == "Running"
    assert job_containers(docker_client, running)

    assert api.delete(job_url(demo, finished)).status_code == 204
    assert api.get(job_url(demo, finished)).status_code == 404
    assert not TrainingJob.objects.filter(id=finished).exists()

    api.post(f"{job_url(demo, running)}/actions", {"action_type": "terminate"}, format="json")
    wait_phase(api, demo, running, "Terminated")
    assert api.delete(job_url(demo, running)).status_code == 204


# -- logs and recoveries -------------------------------------------------------------------------------
def test_task_logs_return_the_whole_log(demo, api, worker):
    job_id = create(api, demo, body(command="for i in $(seq 1 3000); do echo line $i; done"))["metadata"]["id"]
    wait_phase(api, demo, job_id, "Completed")
    response = api.get(f"{job_url(demo, job_id)}/tasks/worker-0/logs")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    text = b"".join(response.streaming_content).decode()
    assert text.splitlines() == [f"line {i}" for i in range(1, 3001)]
    assert api.get(f"{job_url(demo, job_id)}/tasks/worker-1/logs").status_code == 404
    assert api.get(f"{job_url(demo, job_id)}/tasks/nonsense/logs").status_code == 404


def test_recoveries_list_the_sigkill_as_transient(demo, api, worker, docker_client):
    command = 'echo attempt $MA_ATTEMPT; if [ "$MA_ATTEMPT" = 1 ]; then ' + LOOP + "; fi; echo finished"
    job_id = create(api, demo, body(command=command, annotations={RETRY: "2"}))["metadata"]["id"]
    wait_phase(api, demo, job_id, "Running")
    container = wait_for(lambda: job_container(docker_client, job_id), message="container")
    wait_for(lambda: "tick 3" in container.logs().decode(), message="a few ticks")
    container.kill()  # SIGKILL from outside

    status = wait_phase(api, demo, job_id, "Completed")
    assert status["restarts_used"] == 1 and status["max_restarts"] == 2

    recoveries = api.get(f"{job_url(demo, job_id)}/recoveries").json()
    assert recoveries["count"] == 1
    record = recoveries["items"][0]
    assert record["failure_class"] == "transient"
    assert record["exit_code"] == 137
    assert record["oom_killed"] is False
    assert record["restart"] is True
    assert record["level"] == "container"  # the container itself died: it is recreated (SPEC §4)
    assert record["task"] == "worker-0"
    assert (record["failed_attempt"], record["next_attempt"]) == (1, 2)
    assert (record["restarts_used_after"], record["max_restarts"]) == (1, 2)
    assert record["running_again_at"] is not None and record["downtime_s"] > 0
    assert record["explanation"]

    logs = user_lines(b"".join(api.get(f"{job_url(demo, job_id)}/tasks/worker-0/logs").streaming_content).decode())
    assert logs[0] == "attempt 1" and "tick 3" in logs
    assert logs[-2:] == ["attempt 2", "finished"]


def test_notification_and_hang_settings_round_trip_and_events_are_listed(demo, api, worker):
    data = body(name="api-notify")
    data["spec"]["notification"] = {
        "webhook_url": "http://127.0.0.1:9/hook",
        "emails": ["ops@example.org"],
        "events": ["failed"],
    }
    data["spec"]["hang_detection"] = {"window_seconds": 120}
    job_id = create(api, demo, data)["metadata"]["id"]
    wait_phase(api, demo, job_id, "Completed")
    spec = api.get(job_url(demo, job_id)).json()["spec"]
    assert spec["notification"] == {
        "webhook_url": "http://127.0.0.1:9/hook",
        "emails": ["ops@example.org"],
        "events": ["failed"],
    }
    assert spec["hang_detection"] == {"window_seconds": 120}
    events = api.get(f"{job_url(demo, job_id)}/events").json()
    assert [e["kind"] for e in events["items"]] == ["completed", "started"]  # newest first
    assert "job_at_event" not in events["items"][0]["data"]


@pytest.mark.parametrize(
    "notification, path",
    [
        ({"webhook_url": "http://127.0.0.1:9/", "events": ["exploded"]}, "spec.notification.events"),
        ({"events": ["failed"]}, "spec.notification.events"),
        ({"emails": "not-an-address", "events": ["failed"]}, "spec.notification.emails"),
        ({"webhook_url": "not a url", "events": ["failed"]}, "spec.notification.webhook_url"),
    ],
)
def test_bad_notification_settings_are_refused(demo, api, notification, path):
    data = body(name="api-bad-notify")
    data["spec"]["notification"] = notification
    before = TrainingJob.objects.count()
    response = api.post(jobs_url(demo), data, format="json")
    assert response.status_code == 400
    assert path in response.json()["errors"], response.json()
    assert TrainingJob.objects.count() == before


@contextmanager
def broker_refusing():
    """This process's Celery sends go to a loopback port that refuses connections (bound, never
    listening: the kernel answers a connect with a reset), as a broker that is down does. The
    worker's own broker is untouched: it is up, as a worker's is once the broker is back."""
    from console.celery import app

    def fresh_producers() -> None:  # what Celery does after a fork: the next send connects anew
        app._pool = None
        app.amqp._producer_pool = None

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        saved = app.conf.broker_write_url
        app.conf.broker_write_url = f"redis://127.0.0.1:{closed.getsockname()[1]}/0"
        fresh_producers()
        try:
            yield
        finally:
            app.conf.broker_write_url = saved
            fresh_producers()


@runs_jobs
def test_a_job_created_while_the_broker_refuses_is_recorded_and_runs_once_it_is_back(demo, api, caplog):
    """The schedule message is sent after the job's commit. A broker that refused it made the
    request answer 500 for a job it had recorded: a user submits again, and has two. Now the
    refusal is logged, the answer is 201 with the job recorded, and reconcile (its own broker up)
    schedules pending jobs from the database: the job runs."""
    with broker_refusing(), caplog.at_level(logging.WARNING):
        response = api.post(jobs_url(demo), body(name="while-down"), format="json")
    assert response.status_code == 201, response.content
    # Pending when answered, unless the worker's reconcile (every 2 s here) scheduled it during
    # the refused send's retries.
    assert response.json()["status"]["phase"] in ("Pending", "Running", "Completed")
    job_id = response.json()["metadata"]["id"]
    refused = f"could not queue jobs.tasks.schedule_job('{job_id}'); reconcile sends it again"
    assert refused in [r.getMessage() for r in caplog.records], [r.getMessage() for r in caplog.records]
    wait_phase(api, demo, job_id, "Completed", timeout=60)
    assert TrainingJob.objects.filter(workspace=demo.workspace, name="while-down").count() == 1
