"""SSH remote development through the console (jobs/ssh_relay.py): a real OpenSSH client with
console-ssh.py as its ProxyCommand reaches the instance's own sshd (run as ma-user by the
launcher, with the job's host key), checked against the host key the job page shows. A user
who may not see the job, or without a token, gets nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from django.test import Client

from jobs.models import KeyPair, TaskRun
from jobs.runtime import ssh
from tests.helpers import PYTHON_IMAGE, submit_job, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ROOT = Path(__file__).resolve().parent.parent
RELAY = ROOT / "static/console/console-ssh.py"


@pytest.fixture
def ssh_job(demo, worker, tmp_path):
    private, public = ssh.generate_key_pair("owner@laptop")
    key = tmp_path / "id_ed25519"
    key.write_bytes(private)
    key.chmod(0o600)
    pair = KeyPair.objects.create(owner=demo.owner, name="laptop", public_key=public.decode().strip())
    job = submit_job(
        demo, name="remote-dev", image=PYTHON_IMAGE, command="sleep 300", ssh_remote=True, ssh_key_pair=pair
    )
    wait_for(
        lambda: TaskRun.objects.filter(attempt__job=job, state=TaskRun.State.RUNNING).exclude(container_id="").exists(),
        timeout=60,
        message="the instance running",
    )
    known = tmp_path / "known_hosts"
    known.write_text(f"{job.name}-* {ssh.host_public_key(job)}\n")
    return job, key, known


def run_ssh(live_url: str, job, key: Path, known: Path, token: str, command: str) -> subprocess.CompletedProcess:
    port = urlsplit(live_url).port
    proxy = f"{sys.executable} {RELAY} ws://127.0.0.1:{port}/ws/jobs/{job.id}/ssh/0/"
    return subprocess.run(
        [
            "ssh", "-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes",
            "-o", f"HostKeyAlias={job.name}-worker-0", "-o", f"ProxyCommand={proxy}", "-o", "ConnectTimeout=20",
            "ma-user@worker-0", command,
        ],
        env={**os.environ, "CONSOLE_TOKEN": token},
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip


def test_ssh_reaches_the_instance_through_the_console(demo, ssh_job, live_url):
    job, key, known = ssh_job
    # The launcher starts sshd beside the command: retry until it listens.
    result = wait_for(
        lambda: (
            (
                r := run_ssh(live_url, job, key, known, demo.token, "id -u; test -r ~/.ssh/authorized_keys && echo in")
            ).returncode
            == 0
            and r
        ),
        timeout=60,
        message="an SSH session through the console",
    )
    assert result.stdout.split() == ["1000", "in"], result.stderr


def test_refused_without_access_or_token(demo, ssh_job, live_url):
    job, key, known = ssh_job
    wait_for(lambda: run_ssh(live_url, job, key, known, demo.token, "true").returncode == 0, timeout=60)
    outsider = run_ssh(live_url, job, key, known, demo.outsider_token, "true")
    assert outsider.returncode != 0 and "the console refused" in outsider.stderr
    nobody = run_ssh(live_url, job, key, known, "not-a-token", "true")
    assert nobody.returncode != 0 and "the console refused" in nobody.stderr


def test_the_job_page_says_how_to_connect(demo, ssh_job):
    job, _key, _known = ssh_job
    client = Client()
    client.force_login(demo.owner)
    page = client.get(f"/jobs/{job.id}/?tab=attempts").content.decode()
    assert f"/ws/jobs/{job.id}/ssh/0/" in page and "console-ssh.py" in page
    assert ssh.host_public_key(job).split()[1] in page  # the host key to trust


def test_ssh_counts_with_the_terminals_of_its_user(demo, ssh_job, live_url):
    """Terminals and SSH relays share one bound per user (3 in the tests, tests/pytest_env.py):
    a user holding three terminals gets no SSH session, and is told why, until one is closed."""
    from contextlib import ExitStack

    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from tests.wsclient import Shell, open_socket

    job, key, known = ssh_job
    user = get_user_model().objects.create(username="ssh-and-terminals")
    demo.workspace.members.add(user)
    token = Token.objects.create(user=user).key
    wait_for(lambda: run_ssh(live_url, job, key, known, token, "true").returncode == 0, timeout=60)
    with ExitStack() as held:
        for n in range(3):
            shell = Shell(held.enter_context(open_socket(live_url, f"/ws/jobs/{job.id}/terminal/0/", user)))
            shell.type(f"echo held-$((10+{n}))\r")
            shell.read_until(f"held-{10 + n}".encode())
        refused = run_ssh(live_url, job, key, known, token, "true")
        assert refused.returncode != 0
        assert "(4429: you have as many terminals and SSH sessions open as one may" in refused.stderr
    wait_for(
        lambda: run_ssh(live_url, job, key, known, token, "true").returncode == 0,
        timeout=20,
        message="SSH once the terminals were closed",
    )
