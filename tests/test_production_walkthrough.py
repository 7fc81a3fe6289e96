"""The README's production walk-through, run as it is written (README.md, "Running it in
production"): the shell block between its walkthrough markers sets the machine up, makes a
PostgreSQL database, migrates, checks the deployment settings, adds a first workspace and starts
daphne and two Celery workers on Redis. Then, as an operator would try it: the pages answer, a
job created over the API with the printed token runs on the started workers and completes with
its logs, and the job page shows it.

Names are this session's own (database, port, queue, channel prefix, container label, var dir),
so the walk-through never meets the suite's console; everything it started is stopped after.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import requests

from tests.helpers import BUSYBOX, wait_for
from tests.processes import free_port
from tests.pytest_env import TMP

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BLOCK = re.compile(r"<!-- walkthrough:begin -->\s*```sh\n(.*?)```\s*<!-- walkthrough:end -->", re.S)


def walkthrough() -> str:
    found = BLOCK.search(README.read_text())
    assert found, "README.md has no walkthrough block"
    return found.group(1)


def clean_env(**values: str) -> dict[str, str]:
    """The environment of an operator's shell: none of the test session's console settings."""
    keep = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("CONSOLE_", "DJANGO_", "CELERY_", "CHANNELS_")) and k not in ("DATABASE_URL",)
    }
    # The session's container label, so that the suite's own cleanup finds whatever is left.
    keep["CONSOLE_CONTAINER_LABELS"] = os.environ["CONSOLE_CONTAINER_LABELS"]
    return keep | values


@pytest.fixture
def walked(tmp_path):
    session = Path(TMP).name.replace("-", "_")[-24:]
    names = {
        "CONSOLE_DB": f"walk_{session}".lower(),
        "CONSOLE_PORT": str(free_port()),
        "CELERY_QUEUE": f"walk-{session}",
        "CHANNELS_PREFIX": f"walk-{session}",
        "CONSOLE_VAR_DIR": str(tmp_path / "var"),
        "REDIS_URL": os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/9"),
    }
    Path(names["CONSOLE_VAR_DIR"]).mkdir()
    script = tmp_path / "walkthrough.sh"
    script.write_text("set -euo pipefail\n" + walkthrough())
    shell = subprocess.Popen(
        ["bash", str(script)],
        cwd=ROOT,
        env=clean_env(**names),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # the shell and the three processes it leaves running: one group to stop
    )
    try:
        output, _ = shell.communicate(timeout=300)
        assert shell.returncode == 0, output.decode(errors="replace")[-4000:]
        yield names, output.decode(errors="replace")
    finally:
        stop_group(shell.pid)
        subprocess.run(
            ["dropdb", "--if-exists", "--force", "-h", "127.0.0.1", "-U", "postgres", names["CONSOLE_DB"]],
            capture_output=True,
        )


def stop_group(pgid: int) -> None:
    for sig, grace in ((signal.SIGTERM, 20), (signal.SIGKILL, 5)):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)


def logs_of(names: dict) -> str:
    var = Path(names["CONSOLE_VAR_DIR"])
    return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(var.glob("*.log")))


def test_the_readme_walkthrough_starts_a_console_that_runs_a_job(walked):
    names, output = walked
    base = f"http://127.0.0.1:{names['CONSOLE_PORT']}"
    assert f"console on {base}/" in output
    wait_for(lambda: _answers(f"{base}/healthz"), timeout=60, message=f"daphne to answer\n{logs_of(names)}")
    first = Path(names["CONSOLE_VAR_DIR"], "first-login.txt").read_text()
    project = re.search(r"^project_id (\w+)$", first, re.M).group(1)
    token = re.search(r"^api_token (\w+)$", first, re.M).group(1)
    api = requests.Session()
    api.headers["Authorization"] = f"Token {token}"

    # Production mode: no debug page for an unknown path, the secret key generated once, private.
    assert "Traceback" not in requests.get(f"{base}/jobs/create/?copy=x", timeout=10).text
    key = Path(names["CONSOLE_VAR_DIR"], "secret-key")
    assert key.stat().st_mode & 0o777 == 0o600

    body = {
        "kind": "job",
        "metadata": {"name": "walkthrough"},
        "algorithm": {"engine": {"image_url": BUSYBOX}, "command": "echo from-the-walkthrough; sleep 1; echo done"},
        "spec": {"resource": {"node_count": 1}},
    }
    created = api.post(f"{base}/v2/{project}/training-jobs", json=body, timeout=30)
    assert created.status_code == 201, created.text
    job_id = created.json()["metadata"]["id"]

    def phase() -> str | None:
        got = api.get(f"{base}/v2/{project}/training-jobs/{job_id}", timeout=10).json()["status"]["phase"]
        return got if got in ("Completed", "Failed", "Terminated", "Abnormal") else None

    ended = wait_for(phase, timeout=120, message=f"the job to end\n{logs_of(names)}")
    assert ended == "Completed", logs_of(names)
    logs = api.get(f"{base}/v2/{project}/training-jobs/{job_id}/tasks/worker-0/logs", timeout=10)
    assert logs.status_code == 200 and "from-the-walkthrough" in logs.text and "done" in logs.text, logs.text[:2000]

    # Both workers are up, named as the README names them, each on its own queue.
    var = Path(names["CONSOLE_VAR_DIR"])
    control, jobs = (var / "worker-control.log").read_text(), (var / "worker-jobs.log").read_text()
    queue = names["CELERY_QUEUE"]
    assert "control@" in control and f".> {queue}.control " in control, control[:3000]
    assert "jobs@" in jobs and f".> {queue} " in jobs and f"{queue}.control" not in jobs, jobs[:3000]


def _answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=2).status_code == 200
    except requests.RequestException:
        return False
