"""A fault-tolerant job's process exit as its follower learns it: the launcher's report (a file the
job cannot write, reports.py), then the launcher's marker line in the log. The decision reads the
run's log (its failure's signature), so the follower hands the exit over only once the lines before
the marker are persisted; a report seen while the stream was quiet does not mean they are."""

from __future__ import annotations

import queue

import pytest
from django.utils import timezone

from jobs.models import Attempt, TaskRun, TrainingJob
from jobs.runtime import docker_hosts, logs
from tests.helpers import BUSYBOX

SIGNATURE = b"NCCL watchdog: collective operation timeout"
MARKER = b"[console] process exited with code 1; waiting for the supervisor's decision"


class Ended:
    def close(self) -> None:
        pass


@pytest.mark.django_db(transaction=True)  # the acknowledgement writer has a connection of its own
def test_a_report_seen_while_the_stream_was_quiet_waits_for_the_lines_still_on_their_way(demo, monkeypatch):
    """A job quiet for a while prints its failure's signature and exits; the launcher writes its
    report, then its marker. The follower's wait for lines ended (a quiet heartbeat) just as the
    report was written, with the last line and the marker still on their way to it."""
    monkeypatch.setattr(logs, "HEARTBEAT_EVERY_S", 0.2)
    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, name="quiet", image=BUSYBOX, command="true")
    job.full_clean()
    job.save()
    attempt = Attempt.objects.create(job=job, number=1, level="initial", state=Attempt.State.RUNNING)
    in_flight = queue.Queue()
    reports: list[bool] = []

    def report(task_run: TaskRun) -> logs.ProcessExited:
        if not reports:  # the last line and the marker arrive just after the report was seen
            in_flight.put([b"2026-12-06T00:00:01.000000000Z " + SIGNATURE + b"\n"])
            in_flight.put([b"2026-12-06T00:00:01.000100000Z " + MARKER + b"\n"])
        reports.append(True)
        return logs.ProcessExited(1)

    follower = logs.Follower(0, waiting_exit=report)
    run = TaskRun.objects.create(
        attempt=attempt,
        index=0,
        host=demo.host,
        container_name=docker_hosts.container_name(job, 1, 0),
        container_id="q" * 64,
        state=TaskRun.State.RUNNING,
        follower_token=follower.token,
        follower_heartbeat=timezone.now(),
    )
    follower.task_run_id = run.id
    follower._frames, follower._stream = in_flight, Ended()  # a stream already open: quiet so far
    with pytest.raises(logs.ProcessExited):
        follower.follow(run, None)
    run.refresh_from_db()
    assert [line.payload for line in logs.read_lines(run)] == [SIGNATURE, MARKER], (
        "the exit was handed over before the run's last lines were persisted"
    )
