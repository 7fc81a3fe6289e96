"""Resource charts of real containers (jobs/runtime/resources.py): the engine's numbers stored per
instance, whatever the job prints or writes; kept across a worker's death and a process-level
restart; shown on the Resources tab to those who may see the job."""

from __future__ import annotations

import time

import pytest
from django.test import Client

from jobs.models import Phase, ResourceSeries, TaskRun
from jobs.runtime.engine_stats import parse_stats
from jobs.runtime.logs import docker_time
from tests.helpers import PYTHON_IMAGE, submit_job, wait_for

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("worker")]

MB = 1024  # KiB
# One core busy, and 120 MB of pages written (not just reserved) so that they count.
BUSY = "python3 -c \"x = b'1' * (120 << 20); exec('while True: pass')\""
# Everything a job could try to pass off as its resource use: lines shaped like samples (ours,
# Docker's stats JSON, nvidia-smi's), cgroup-looking files in its folders, a write to the real
# cgroup (read-only), then it idles.
HOSTILE = (
    "mkdir -p $MA_CHECKPOINT_DIR/sys/fs/cgroup/memory /tmp/sys/fs/cgroup/cpuacct; "
    "echo 987654321987 > $MA_CHECKPOINT_DIR/sys/fs/cgroup/memory/memory.usage_in_bytes; "
    "echo 987654321987 > /tmp/sys/fs/cgroup/memory.current; "
    "echo 123456789000000000 > /tmp/sys/fs/cgroup/cpuacct/cpuacct.usage; "
    "printf 'usage_usec 123456789000000\\n' > /tmp/sys/fs/cgroup/cpu.stat; "
    "cp -r /tmp/sys /cache/ 2>/dev/null; "
    "echo 987654321987 > /sys/fs/cgroup/memory/memory.usage_in_bytes 2>/dev/null || echo the real cgroup is read-only; "
    "while true; do echo '[resources] cpu_cores=64 memory_mb=999999 gpu_percent=100'; "
    'echo \'{"read": "2026-01-01T00:00:00Z", "cpu_stats": {"cpu_usage": {"total_usage": 123456789000000000}}, '
    '"memory_stats": {"usage": 987654321987}}\'; '
    "echo 'utilization.gpu [%]'; echo '100 %'; sleep 0.5; done"
)


def series_of(job, index: int = 0, attempt: int = 1) -> ResourceSeries | None:
    return ResourceSeries.objects.filter(
        task_run__attempt__job=job, task_run__attempt__number=attempt, task_run__index=index
    ).first()


def with_points(job, count: int, **kwargs):
    def enough():
        row = series_of(job, **kwargs)
        return row if row is not None and len(row.series().points) >= count else None

    return wait_for(enough, timeout=90, interval=0.5, message=f"{count} resource points")


def resources_tab(client: Client, job) -> object:
    return client.get(f"/jobs/{job.id}/?tab=resources", HTTP_HX_REQUEST="true")


def logged_in(username: str) -> Client:
    client = Client()
    assert client.login(username=username, password=f"{username}-password")
    return client


def test_a_busy_job_is_charted_from_the_engines_numbers(demo, docker_client):
    job = submit_job(demo, name="busy", image=PYTHON_IMAGE, command=BUSY)
    row = with_points(job, 4)
    run = TaskRun.objects.get(attempt__job=job, index=0)
    container = docker_client.containers.get(run.container_id)
    # The limits are the container's own, from the engine's inspect.
    assert row.memory_limit_kib == container.attrs["HostConfig"]["Memory"] // 1024
    assert row.cpu_limit_millicores == container.attrs["HostConfig"]["NanoCpus"] // 1_000_000
    # Memory: the 120 MB the job wrote, within its limit, as the engine reports it right now.
    now = parse_stats(container.stats(stream=False, one_shot=True))
    now_at = time.time()
    row = with_points(job, len(row.series().points) + 1)
    points = row.series().points
    assert 120 * MB <= points[-1].memory_kib < row.memory_limit_kib
    assert abs(points[-1].memory_kib - now.memory_bytes // 1024) < 32 * MB
    # CPU: a busy loop, clearly busy (an idle job reads ~0), as busy as the engine says it was. Not
    # "most of a core", nor a fixed share: on this 2-CPU machine in a full run (four test sessions,
    # their workers and containers) one got 386 millicores, another 186. The engine's average since
    # the container started says what this one got; its busiest point is at least half of that.
    assert now.cpu_ns is not None, "the engine gave no CPU time for a running container"
    started = docker_time(container.attrs["State"]["StartedAt"]).timestamp()
    engine_milli = now.cpu_ns / 1e6 / (now_at - started)
    assert engine_milli >= 50, f"the machine gave the busy loop {engine_milli:.0f} millicores"
    assert max(p.cpu_milli for p in points) >= min(200, engine_milli / 2), (engine_milli, points)
    assert all(p.cpu_milli <= row.cpu_limit_millicores + 100 for p in points)
    assert all(p.gpu_permille is None for p in points)  # no GPU flavor, no GPU line

    # The tab shows it to whoever may see the job, and to nobody else.
    page = resources_tab(logged_in("owner"), job)
    assert page.status_code == 200
    text = page.content.decode()
    assert 'data-task="worker-0"' in text and " cores" in text and 'id="resource-data"' in text
    assert 'hx-trigger="every' in text  # live while the job runs
    assert resources_tab(logged_in("outsider"), job).status_code == 404


def test_what_a_job_prints_or_writes_does_not_change_its_numbers(demo, docker_client):
    job = submit_job(demo, name="hostile", command=HOSTILE)
    row = with_points(job, 5)
    run = TaskRun.objects.get(attempt__job=job, index=0)
    assert run.log_lines > 5  # it did print its fake samples
    points = row.series().points
    # A shell that echoes twice a second: a few percent of a core and a few MB, nothing like
    # the 64 cores, 999999 MB, 100 % GPU or 123456789 s of CPU it claims.
    assert all(p.cpu_milli < 500 for p in points), points
    assert all(p.memory_kib < 64 * MB for p in points), points
    assert all(p.gpu_permille is None for p in points)
    assert row.cpu_ns < 60 * 10**9  # the cumulative counter is the container's own
    text = resources_tab(logged_in("owner"), job).content.decode()
    assert "999999" not in text and "987654" not in text


def test_the_chart_survives_a_worker_restart(demo, worker):
    job = submit_job(demo, name="steady", command="while true; do sleep 1; done")
    before = with_points(job, 3).series().points
    worker.kill()  # its unwritten points (at most a flush interval) die with it
    worker.ensure_running()
    after = with_points(job, len(before) + 3).series().points
    assert after[: len(before)] == before  # the database kept them, and the new follower went on from them
    # Went on from the stored counter: no point is lost between them, and the one that spans the
    # worker's downtime is an average over it, not a spike.
    assert all(b.start == a.end for a, b in zip(after, after[1:], strict=False))
    assert all(p.cpu_milli < 500 for p in after)


def test_a_process_restart_charts_each_run_of_the_one_container(demo):
    job = submit_job(
        demo,
        name="twice",
        fault_tolerance=True,
        max_restarts=3,
        command='if [ "$MA_ATTEMPT" = 1 ]; then sleep 6; echo "NCCL watchdog: collective operation timeout"; '
        "exit 1; fi; sleep 6",
    )
    wait_for(lambda: job.refresh_from_db() or job.is_final, timeout=90, message="the job to end")
    assert job.phase == Phase.COMPLETED, job.phase_reason

    def both():
        rows = [series_of(job, attempt=n) for n in (1, 2)]
        return rows if all(row is not None and row.series().points for row in rows) else None

    first, second = wait_for(both, message="both runs' series")
    assert first.task_run.container_id == second.task_run.container_id
    # The second run's chart starts where the first one's last point ended: one line, two runs.
    first_end = first.at(first.series().points[-1].end)
    assert abs((second.origin - first_end).total_seconds()) < 1
    text = resources_tab(logged_in("owner"), job).content.decode()
    assert 'hx-trigger="every' not in text  # ended: no more polling
    row = text[text.index('data-task="worker-0"') :]
    assert '<td class="num">2</td>' in row[: row.index("</tr>")]  # two runs for worker-0
