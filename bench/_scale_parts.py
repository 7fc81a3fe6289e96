"""Where a supervisor_scale probe's time went (bench/supervisor_scale.py): each stop and each restart
cut into steps from the database's timestamps, the engine's FinishedAt and the worker's traced
Docker calls (bench/_trace.py); and the worker's waits for a pooled database connection."""

from __future__ import annotations

import os
import time
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")

POSTED: dict[str, float] = {}  # job id -> wall time of its Stop's POST


def _stop_tasks(path: Path | None) -> tuple[dict[str, float], dict[str, float]]:
    """When each job's stop task was sent (daphne) and began (the worker): bench/_trace.py's
    BENCH_TASK_TRACE lines, by job id."""
    sent: dict[str, float] = {}
    began: dict[str, float] = {}
    if path is not None and path.exists():
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 5 and parts[3].endswith(".stop_job"):
                (sent if parts[0] == "SENT" else began)[parts[4]] = int(parts[1]) / 1e9
    return sent, began


def stop_breakdown(trace_path: Path, job_ids: list[str], task_trace: Path | None = None) -> dict[str, list[float]]:
    """Where each stop's time went (ms), from the database's timestamps, the engine's FinishedAt
    and the worker's traced Docker calls: the request, the worker's stop call, the container's
    exit, the job's end; with `task_trace`, the queue step split where the stop task was sent and
    where it began."""
    from jobs.models import TaskRun, TrainingJob

    sent, began = _stop_tasks(task_trace)

    calls = []
    looks = []  # (start, end, thread, path) of the worker's inspects: the stop's own look-up
    if trace_path.exists():
        for line in trace_path.read_text().splitlines():
            parts = line.split(" ", 5)
            if len(parts) == 6 and parts[4] == "POST" and "/stop" in parts[5]:
                calls.append((int(parts[0]) / 1e9, int(parts[1]) / 1e9, parts[5], parts[3]))
            elif len(parts) == 6 and parts[4] == "GET" and parts[5].split("?")[0].endswith("/json"):
                looks.append((int(parts[0]) / 1e9, int(parts[1]) / 1e9, parts[3]))
    out: dict[str, list[float]] = {}
    for job_id in job_ids:
        job = TrainingJob.objects.get(id=job_id)
        run = TaskRun.objects.filter(attempt__job_id=job_id, ended_at__isnull=False).order_by("-ended_at").first()
        stop = next((c for c in calls if run and run.container_id and run.container_id in c[2]), None)
        if run is None or stop is None or job.ended_at is None:
            continue
        requested = job.terminate_requested_at.timestamp()
        # The stop task's calls before its stop (same thread, after the request): the look-ups.
        before = [c for c in looks if c[2] == stop[3] and requested <= c[0] and c[1] <= stop[0]]
        first_call = min((c[0] for c in before), default=stop[0])
        marks = [
            ("request", POSTED[job_id], requested),
            ("queued -> first engine call", requested, first_call),
            ("look-ups before the stop", first_call, stop[0]),
            ("stop call -> exit", stop[0], run.ended_at.timestamp()),
            ("exit -> stop call returned", run.ended_at.timestamp(), stop[1]),
            ("stop returned -> Terminated", stop[1], job.ended_at.timestamp()),
        ]
        if job_id in sent and job_id in began:
            marks[1:2] = [
                ("requested -> stop task sent", requested, sent[job_id]),
                ("sent -> the task began", sent[job_id], began[job_id]),
                ("the task began -> first call", began[job_id], first_call),
            ]
        for what, a, b in marks:
            out.setdefault(what, []).append((b - a) * 1000)
        # The stop split in two: the engine's stop call, and the console's own part around it
        # (the request, the queue and the look-ups before the call, the job's end after it).
        out.setdefault(ENGINES_PART, []).append((stop[1] - stop[0]) * 1000)
        own = (stop[0] - POSTED[job_id]) + (job.ended_at.timestamp() - stop[1])
        out.setdefault(CONSOLES_PART, []).append(own * 1000)
    return out


ENGINES_PART = "= the engine's stop call"
CONSOLES_PART = "= the console's own part"


def pool_waits(path: Path, windows: list[tuple[float, float]]) -> list[float]:
    """The worker's waits for a pooled database connection (over 2 ms) that began in one of the
    windows (start, end), ms."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split(" ", 2)
            if len(parts) == 3 and any(start <= int(parts[0]) / 1e9 <= end for start, end in windows):
                out.append((int(parts[1]) - int(parts[0])) / 1e6)
    return out


KILLED: dict[str, tuple[float, float, int]] = {}  # job id -> wall times around the kill, the attempt
SEEN: dict[str, float] = {}  # job id -> wall time the bench saw the next attempt's run running


def restart_breakdown(trace_path: Path, job_ids: list[str]) -> dict[str, list[float]]:
    """Where each restart's time went (ms), from the engine's FinishedAt, the database's timestamps
    and the worker's traced Docker calls: the kill, the follower's look at the ended container and
    its last read of the log, the decision, the look-up of the armed standby, the take-over."""
    from jobs.models import Attempt, TaskRun

    calls = []  # (start, end, path) of the worker's container calls
    if trace_path.exists():
        for line in trace_path.read_text().splitlines():
            parts = line.split(" ", 5)
            if len(parts) == 6 and "/containers/" in parts[5]:
                calls.append((int(parts[0]) / 1e9, int(parts[1]) / 1e9, parts[5].split("?")[0]))
    out: dict[str, list[float]] = {}
    for job_id in job_ids:
        if job_id not in KILLED or job_id not in SEEN:
            continue
        killed_at, kill_returned, number = KILLED[job_id]
        dead = TaskRun.objects.filter(attempt__job_id=job_id, attempt__number=number, index=0).first()
        ended = Attempt.objects.filter(job_id=job_id, number=number).first()
        nxt = (
            TaskRun.objects.select_related("attempt").filter(attempt__job_id=job_id, attempt__number=number + 1).first()
        )
        known = dead and dead.container_id and dead.ended_at and ended and ended.ended_at
        if not (known and nxt and nxt.attempt.started_at):
            continue
        exit_at = dead.ended_at.timestamp()
        on_dead = [c for c in calls if dead.container_id in c[2] and c[0] >= exit_at - 0.05]
        looked = min((c[0] for c in on_dead), default=None)
        last_read = max((c[1] for c in on_dead if c[1] <= ended.ended_at.timestamp()), default=None)
        lookup = next(
            (c for c in calls if c[2].endswith(f"/containers/{nxt.container_name}/json") and c[0] >= exit_at), None
        )
        if looked is None or last_read is None or lookup is None:
            continue
        marks = [
            ("kill call", killed_at, kill_returned),
            ("kill returned -> exit", kill_returned, exit_at),
            ("exit -> follower's look", exit_at, looked),
            ("look + last read of the log", looked, last_read),
            ("-> attempt decided", last_read, ended.ended_at.timestamp()),
            ("decided -> standby looked up", ended.ended_at.timestamp(), lookup[0]),
            ("standby look-up", lookup[0], lookup[1]),
            ("take-over -> running", lookup[1], nxt.attempt.started_at.timestamp()),
            ("running -> seen", nxt.attempt.started_at.timestamp(), SEEN[job_id]),
        ]
        for what, a, b in marks:
            out.setdefault(what, []).append((b - a) * 1000)
    return out


def _process_ticks() -> dict[tuple[int, int], tuple[str, int]]:
    """Every process's kind and CPU ticks so far, its reaped children's included (a container's
    `sleep 1` is charged to the shell that waited for it), keyed by (pid, start time)."""
    from bench.suite_cpu import _cmdline, _kind

    out = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks = sum(int(f) for f in fields[11:15])  # utime, stime, cutime, cstime
        out[(int(name), int(fields[19]))] = (_kind(int(name), _cmdline(int(name))), ticks)
    return out


def cpu_by_kind(seconds: float) -> dict[str, float]:
    """Where the machine's CPU went over the next `seconds`, by kind of process (percent of one
    core). A process that started and ended in the window is missed unless a survivor reaped it."""
    before = _process_ticks()
    time.sleep(seconds)
    after = _process_ticks()
    spent: dict[str, float] = {}
    for key, (kind, ticks) in after.items():
        used = ticks - before.get(key, (kind, 0))[1]
        if used > 0:
            spent[kind] = spent.get(kind, 0.0) + used / HZ / seconds * 100
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))
