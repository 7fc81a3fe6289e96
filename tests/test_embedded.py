"""The run command's embedded mode: SQLite, in-process worker, in-memory channel layer.

Runs `manage.py embedded` as its own process (no DATABASE_URL, no REDIS_URL)
and uses it as a user would: API to create a job, a websocket to watch its
log, the API again to see it restarted and finished.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import docker
import pytest
import requests

from tests.helpers import job_container, wait_for
from tests.processes import ROOT, answers, free_port
from tests.pytest_env import TEST_LABEL, TMP
from tests.wsclient import connect


@pytest.fixture(scope="module")
def embedded(docker_client):
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "REDIS_URL")}
    env["CONSOLE_VAR_DIR"] = str(Path(TMP) / "embedded")
    env["CONSOLE_LOG_ROOT"] = str(Path(TMP) / "embedded" / "logs")
    env["CONSOLE_LOG_LEVEL"] = "INFO"  # embedded.log says what the supervisor did, for a failure's reader
    manage = [sys.executable, "manage.py"]
    subprocess.run([*manage, "migrate", "--noinput", "-v0"], cwd=ROOT, env=env, check=True)
    seeded = subprocess.run([*manage, "seed_demo"], cwd=ROOT, env=env, check=True, capture_output=True, text=True)
    facts = dict(line.split(" ", 1) for line in seeded.stdout.splitlines() if " " in line)
    port = free_port()
    log = open(Path(TMP) / "embedded.log", "ab")
    proc = subprocess.Popen(
        [*manage, "embedded", "--port", str(port)], cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
    )
    wait_for(lambda: answers(port), timeout=30, message="the embedded server")
    yield {"url": f"http://127.0.0.1:{port}", "project_id": facts["project_id"], "token": facts["api_token"]}
    proc.terminate()
    proc.wait(10)
    for container in docker_client.containers.list(all=True, sparse=True, filters={"label": "=".join(TEST_LABEL)}):
        try:
            container.remove(force=True)
        except docker.errors.NotFound:
            pass


def test_embedded_mode_runs_restarts_and_streams_a_job(embedded, docker_client):
    base, headers = embedded["url"], {"Authorization": f"Token {embedded['token']}"}
    jobs_url = f"{base}/v2/{embedded['project_id']}/training-jobs"
    body = {
        "metadata": {"name": "embedded-1", "annotations": {"fault-tolerance/job-retry-num": "1"}},
        "algorithm": {
            # The first attempt waits after line 10 until the test kills it: a loaded machine showed
            # line 10 on the page after the container had ended (2 s of output), and the kill found none.
            "command": "echo attempt $MA_ATTEMPT; for i in $(seq 1 40); do echo line $i; sleep 0.05; "
            'if [ $i = 10 ] && [ "$MA_ATTEMPT" = 1 ]; then sleep 300; fi; done',
            "engine": {"image_url": "console/busybox:latest"},
        },
    }
    created = requests.post(jobs_url, json=body, headers=headers, timeout=10)
    assert created.status_code == 201, created.text
    job_id = created.json()["metadata"]["id"]

    session = requests.Session()
    login_page = session.get(f"{base}/accounts/login/", timeout=10)
    csrf = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', login_page.text).group(1)
    session.post(
        f"{base}/accounts/login/",
        data={"username": "demo", "password": "demo-password", "csrfmiddlewaretoken": csrf},
        headers={"Referer": f"{base}/accounts/login/"},
        timeout=10,
    )
    cookie = f"sessionid={session.cookies['sessionid']}"
    ws_url = base.replace("http", "ws") + f"/ws/jobs/{job_id}/logs/0/"
    seen: list[str] = []
    with connect(ws_url, additional_headers={"Cookie": cookie, "Origin": base}, open_timeout=10) as ws:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and "line 10" not in seen:
            seen += re.findall(r'<div class="ln" data-n="\d+">([^<]*)</div>', ws.recv(timeout=10))
    env_checks = [line for line in seen if line.startswith("[env-check]")]
    assert [line.split(",")[0] for line in env_checks] == [
        "[env-check] item: dns",
        "[env-check] item: disk-size root",
        "[env-check] item: disk-size shm",
        "[env-check] item: disk-size cache",
    ]
    assert [line for line in seen if not line.startswith("[")][:3] == ["attempt 1", "line 1", "line 2"]

    container = job_container(docker_client, job_id)
    container.kill()

    def finished():
        job = requests.get(f"{jobs_url}/{job_id}", headers=headers, timeout=10).json()
        return job if job["status"]["phase"] in ("Completed", "Failed") else None

    job = wait_for(finished, timeout=60, interval=0.5, message="the job to finish")
    assert job["status"]["phase"] == "Completed"
    assert (job["status"]["restarts_used"], job["status"]["max_restarts"]) == (1, 1)
    log = requests.get(f"{jobs_url}/{job_id}/tasks/worker-0/logs", headers=headers, timeout=10).text
    assert "attempt 2" in log and log.rstrip().endswith("line 40")
    recoveries = requests.get(f"{jobs_url}/{job_id}/recoveries", headers=headers, timeout=10).json()
    assert [(r["failure_class"], r["exit_code"], r["restart"]) for r in recoveries["items"]] == [
        ("transient", 137, True)
    ]
    assert json.dumps(recoveries)  # serialisable as the API promises


def test_the_demo_template_runs_on_the_demo_dedicated_pool(embedded):
    """What ./run.sh seeds is usable as is: the spiral template (code in object storage) on the
    dedicated pool, with the preset dataset mounted and a checkpoint written."""
    base, headers = embedded["url"], {"Authorization": f"Token {embedded['token']}"}
    jobs_url = f"{base}/v2/{embedded['project_id']}/training-jobs"
    body = {
        "metadata": {"name": "demo-template"},
        "algorithm": {
            "template": "spiral-mlp",
            "environments": [{"name": "TRAIN_STEPS", "value": "30"}, {"name": "TRAIN_SLEEP_S", "value": "0"}],
            "inputs": [{"name": "data", "remote": {"dataset": {"id": 1}}}],
        },
        "spec": {"resource": {"pool_id": "team-pool", "flavor_id": "cpu.1u2g", "node_count": 1}},
    }
    created = requests.post(jobs_url, json=body, headers=headers, timeout=10)
    assert created.status_code == 201, created.text
    job_id = created.json()["metadata"]["id"]

    def finished():
        job = requests.get(f"{jobs_url}/{job_id}", headers=headers, timeout=10).json()
        return job if job["status"]["phase"] in ("Completed", "Failed") else None

    job = wait_for(finished, timeout=90, interval=0.5, message="the template job to finish")
    log = requests.get(f"{jobs_url}/{job_id}/tasks/worker-0/logs", headers=headers, timeout=10).text
    assert job["status"]["phase"] == "Completed", log[-2000:]
    assert "[checkpoint] saved step=20" in log and "[done] step=30" in log
    assert job["spec"]["resource"]["pool_id"] == "team-pool"
