"""The job list at the quota: the first page of the list page and of the API list with 10,000 jobs.

SPEC §3 "quota" lets one account hold 10,000 jobs. This script fills its own PostgreSQL database
with the jobs of one user in one workspace (in steps: 10, then 1,000, then 10,000 jobs) and at each
size measures the first page of

- the job list page, GET / (jobs/views/list.py, jobs/listing.py), as the logged-in member, and
- the API list, GET /v2/{project_id}/training-jobs (jobs/api/views.py), with the member's token,

unfiltered, filtered (by phase, by name) and sorted (creation time and duration, both orders):
p50/p95 over --requests requests after --warmup requests, over HTTP against a real daphne process
with DEBUG off (what a browser or a script sees: ASGI, middleware, session or token lookup, the
whole response body). The SQL queries of each request are counted in this process with Django's
test Client under CaptureQueriesContext (the same views, the same database); the count must be the
same at every size.

Target: at 10,000 jobs the first page's p95 < 100 ms for every case of page and API, and a constant
query count. Exit status 0 when met. The 10-job figures are the baseline (ratio 10,000/10 printed).

No Celery worker runs: the phases are written as they are and nothing may change them under the
measurement (a worker would reconcile the Running jobs, which have no containers).

    .venv/bin/python bench/job_list.py [--sizes 10,1000,10000] [--requests 60] [--warmup 5] [--explain]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench._stack import PYTHON_IMAGE, Stack, percentile  # noqa: E402

TARGET_P95_MS = 100.0
SEED = 20261201

# (label, query string): the first page of each.
CASES = [
    ("unfiltered", ""),
    ("phase=Running", "phase=Running"),
    ("phase=Failed", "phase=Failed"),
    ("name=bert (common)", "name=bert"),
    ("name=00007 (one job)", "name=00007"),
    ("create_time desc", "sort_by=create_time&order=desc"),
    ("create_time asc", "sort_by=create_time&order=asc"),
    ("duration desc", "sort_by=duration&order=desc"),
    ("duration asc", "sort_by=duration&order=asc"),
    ("Completed by duration", "phase=Completed&sort_by=duration&order=desc"),
]

# A user's jobs over half a year: mostly ended, some running or waiting (weights in percent).
PHASE_WEIGHTS = {
    "Completed": 44,
    "Failed": 18,
    "Terminated": 10,
    "Running": 8,
    "Pending": 5,
    "Creating": 3,
    "Restarting": 2,
    "Abnormal": 2,
    "Terminating": 1,
    "CompletedRetained": 5,
    "FailedRetained": 2,
}
MODELS = ["bert", "resnet", "gpt", "llama", "vit", "whisper", "t5", "yolo", "qwen", "mnist", "spiral", "unet"]
VARIANTS = ["base", "large", "small", "ft", "pretrain", "sweep", "eval", "distill"]
# The first jobs' phases, so that every filtered case has rows at the smallest size too (an empty page
# makes one query less: no rows to fetch, and that is no sign of a query per row).
FIRST_PHASES = ["Completed", "Running", "Failed", "Completed", "Pending", "Failed", "Running", "Completed"]
FAILURES = ["oom", "nccl", "signal", "traceback", "hang", "ecc", "lost_host"]


class ListStack(Stack):
    """The benchmark stack without the Celery worker (see the module's docstring)."""

    def _spawn(self, name: str, argv: list[str]) -> None:
        if name != "celery-worker":
            super()._spawn(name, argv)


# -- the data ------------------------------------------------------------------------------------------------
class Catalogue:
    """The presets and assets the jobs point at, so every foreign key the API shows is exercised."""

    def __init__(self, user, workspace):
        from jobs.models import (
            DockerHost,
            FileSystem,
            Flavor,
            KeyPair,
            Model,
            ModelVersion,
            PresetImage,
            PresetTemplate,
            ResourcePool,
        )

        self.user, self.workspace = user, workspace
        self.host = DockerHost.objects.get(name="local")
        self.pool = ResourcePool.objects.create(name="bench-dedicated", kind=ResourcePool.Kind.DEDICATED)
        self.flavors = [
            Flavor.objects.create(name="cpu.2u4g", cpus=2, memory_mb=4096),
            Flavor.objects.create(name="cpu.8u32g", cpus=8, memory_mb=32768),
            Flavor.objects.create(name="GPU:1*tnt004", cpus=8, memory_mb=65536, gpus=1, gpu_type="tnt004"),
            Flavor.objects.create(name="NPU:8*snt9b", cpus=192, memory_mb=1572864, gpus=8, npu=True),
        ]
        self.images = [
            PresetImage.objects.create(name="python-3.11", image_ref=PYTHON_IMAGE),
            PresetImage.objects.create(name="pytorch-2.3-cuda12", image_ref="console/pytorch:2.3-cuda12"),
        ]
        self.template = PresetTemplate.objects.create(name="spiral-mlp", brand="Console", image=self.images[0])
        self.file_system = FileSystem.objects.create(name="shared", source="/srv/shared")
        self.key_pair = KeyPair.objects.create(
            owner=user,
            name="laptop",
            public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl bench@laptop",
        )
        self.base_model = Model.objects.create(owner=user, name="qwen-base", type=Model.Type.TEXT_GENERATION)
        self.publish_model = Model.objects.create(owner=user, name="spiral", type=Model.Type.OTHER)
        self.versions = [ModelVersion.objects.create(model=self.publish_model, number=n) for n in (1, 2, 3)]


def make_jobs(cat: Catalogue, start: int, count: int, now, rng: random.Random) -> None:
    """Jobs start .. start+count-1 of the user, with their attempts, task runs and recovery records."""
    from faulttolerance.models import RecoveryRecord
    from jobs.models import Attempt, TaskRun, TrainingJob

    phases, weights = zip(*PHASE_WEIGHTS.items(), strict=True)
    ended = {"Completed", "Failed", "Terminated", "CompletedRetained", "FailedRetained"}
    never_started = {"Creating", "Pending"}
    jobs: list[TrainingJob] = []
    for i in range(start, start + count):
        phase = FIRST_PHASES[i] if i < len(FIRST_PHASES) else rng.choices(phases, weights)[0]
        created = now - timedelta(seconds=rng.uniform(60, 180 * 86400))
        started = None if phase in never_started else created + timedelta(seconds=rng.uniform(2, 600))
        ran = timedelta(seconds=min(rng.lognormvariate(7.5, 1.6), 5 * 86400))
        if started and started + ran > now:
            ran = (now - started) * rng.random()
        ft = rng.random() < 0.4
        max_restarts = rng.choice([1, 3, 5, 10]) if ft else 3
        used = rng.randint(0, max_restarts) if ft and started else 0
        preset = rng.random() < 0.3
        dedicated = rng.random() < 0.2
        finetune = rng.random() < 0.05
        publish = rng.random() < 0.08
        published = publish and phase == "Completed" and rng.random() < 0.5
        job = TrainingJob(
            workspace=cat.workspace,
            created_by=cat.user,
            name=f"{MODELS[i] if i < len(MODELS) else rng.choice(MODELS)}-{rng.choice(VARIANTS)}-{i:05d}",
            description=rng.choice(["", "nightly run", "hyper-parameter sweep", "baseline for the report"]),
            training_mode=TrainingJob.TrainingMode.FINETUNE if finetune else TrainingJob.TrainingMode.CUSTOM,
            base_model=cat.base_model if finetune else None,
            preset_template=cat.template if rng.random() < 0.1 else None,
            image_source=TrainingJob.ImageSource.PRESET if preset else TrainingJob.ImageSource.CUSTOM,
            preset_image=rng.choice(cat.images) if preset else None,
            image=PYTHON_IMAGE,
            command="python3 train.py --epochs 10",
            pool_type=TrainingJob.PoolType.DEDICATED if dedicated else TrainingJob.PoolType.PUBLIC,
            pool=cat.pool if dedicated else None,
            flavor=rng.choice(cat.flavors) if rng.random() < 0.7 else None,
            node_count=rng.choice([1, 1, 1, 2, 4, 8]),
            priority=rng.choice([1, 2, 2, 3]),
            preemptible=rng.random() < 0.2,
            auto_publish=publish,
            publish_as=TrainingJob.PublishAs.VERSION if publish and rng.random() < 0.6 else TrainingJob.PublishAs.NEW,
            publish_model=cat.publish_model if publish else None,
            model_name="spiral" if publish else "",
            published_version=rng.choice(cat.versions) if published else None,
            publish_checked_at=(started + ran) if published else None,
            fault_tolerance=ft,
            max_restarts=max_restarts,
            hang_restart=ft and rng.random() < 0.3,
            pod_retry_num=rng.choice([0, 0, 2]) if ft else 0,
            ssh_remote=rng.random() < 0.05,
            ssh_key_pair=cat.key_pair if rng.random() < 0.05 else None,
            observe_file_system=cat.file_system if rng.random() < 0.05 else None,
            visibility=TrainingJob.Visibility.CREATOR if rng.random() < 0.1 else TrainingJob.Visibility.WORKSPACE,
            phase=phase,
            restarts_used=used,
            hang_restarts_used=rng.randint(0, 2) if ft else 0,
            created_at=created,
            started_at=started,
            ended_at=(started + ran) if started and phase in ended else None,
            tags=[{"key": "team", "value": "vision"}] if rng.random() < 0.3 else [],
        )
        jobs.append(job)
    TrainingJob.objects.bulk_create(jobs, batch_size=1000)

    # One attempt per start (1 + restarts used), node_count task runs each; a recovery record per restart.
    attempts: list[Attempt] = []
    for job in jobs:
        if not job.started_at:
            continue
        for number in range(1, job.restarts_used + 2):
            last = number == job.restarts_used + 1
            attempts.append(
                Attempt(
                    job=job,
                    number=number,
                    level="initial" if number == 1 else rng.choice(["process", "container", "job"]),
                    state=Attempt.State.ENDED if (not last or job.ended_at) else Attempt.State.RUNNING,
                    outcome=(Attempt.Outcome.FAILED if not last else "") if not job.ended_at or not last else "",
                    created_at=job.started_at,
                    started_at=job.started_at,
                    ended_at=job.ended_at if last else job.started_at + timedelta(seconds=30),
                )
            )
    Attempt.objects.bulk_create(attempts, batch_size=2000)
    runs, records = [], []
    by_job: dict = {}
    for attempt in attempts:
        by_job.setdefault(attempt.job_id, []).append(attempt)
        for index in range(min(attempt.job.node_count, 2)):
            runs.append(
                TaskRun(
                    attempt=attempt,
                    index=index,
                    host=cat.host,
                    container_name=f"job-{attempt.job_id}-{attempt.number}-{index}",
                    state=TaskRun.State.EXITED if attempt.ended_at else TaskRun.State.RUNNING,
                    started_at=attempt.started_at,
                    ended_at=attempt.ended_at,
                    exit_code=0 if attempt.ended_at else None,
                    log_lines=rng.randint(0, 5000),
                )
            )
    for job_attempts in by_job.values():
        job = job_attempts[0].job
        for failed, following in zip(job_attempts, job_attempts[1:], strict=False):
            records.append(
                RecoveryRecord(
                    job=job,
                    failed_attempt=failed,
                    next_attempt=following,
                    detected_at=failed.ended_at,
                    failure_class=rng.choice(FAILURES),
                    restart=True,
                    level=following.level,
                    decision=f"restart ({following.level})",
                    restarts_used_after=following.number - 1,
                    max_restarts=job.max_restarts,
                    running_again_at=failed.ended_at + timedelta(seconds=5),
                )
            )
    TaskRun.objects.bulk_create(runs, batch_size=2000)
    RecoveryRecord.objects.bulk_create(records, batch_size=2000)


def vacuum_analyze() -> None:
    """What autovacuum does after such an insert (fresh planner statistics, the visibility map), done
    before the measurement instead of during it."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE")


# -- the measurement -----------------------------------------------------------------------------------------
class Endpoint:
    def __init__(self, label: str, path: str, session, client, rows: int):
        self.label, self.path, self.session, self.client, self.rows = label, path, session, client, rows

    def url(self, qs: str) -> str:
        return self.path + (f"?{qs}" if qs else "")


def count_queries(endpoint: Endpoint, qs: str) -> tuple[int, float, list[str]]:
    """Queries of one request in this process (same views, same database): count, SQL ms, the SQL."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    endpoint.client.get(endpoint.url(qs))  # warm (first-use caches of this process)
    with CaptureQueriesContext(connection) as captured:
        response = endpoint.client.get(endpoint.url(qs))
    if response.status_code != 200:
        raise RuntimeError(f"{endpoint.url(qs)}: {response.status_code} {response.content[:500]!r}")
    sql_ms = sum(float(q["time"]) for q in captured.captured_queries) * 1000
    return len(captured), sql_ms, [q["sql"] for q in captured.captured_queries]


def time_requests(stack: Stack, endpoint: Endpoint, warmup: int, n: int) -> dict[str, tuple[list[float], int]]:
    """Wall times (ms, ascending) of n requests over HTTP per case after the warm-up, and the rows
    the last one showed. The cases take turns, one request each, so a burst of load from another
    process on the machine spreads over all of them instead of spoiling one case's p95."""
    times: dict[str, list[float]] = {label: [] for label, _ in CASES}
    rows: dict[str, int] = {}
    for i in range(warmup + n):
        for label, qs in CASES:
            url = stack.url + endpoint.url(qs)
            t0 = time.perf_counter()
            response = endpoint.session.get(url, timeout=30)
            elapsed = (time.perf_counter() - t0) * 1000
            if response.status_code != 200:
                raise RuntimeError(f"{url}: {response.status_code} {response.text[:500]}")
            if i >= warmup:
                times[label].append(elapsed)
            rows[label] = shown_rows(endpoint, response)
    return {label: (sorted(times[label]), rows[label]) for label in times}


def shown_rows(endpoint: Endpoint, response) -> int:
    if endpoint.label == "api":
        return len(response.json()["items"])
    return response.text.count('id="job-row-')


def explain(sql: str) -> str:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + sql)
        return "\n".join(row[0] for row in cursor.fetchall())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="10,1000,10000", help="job counts to measure at, ascending")
    parser.add_argument("--requests", type=int, default=60, help="timed requests per case and size")
    parser.add_argument("--warmup", type=int, default=5, help="untimed requests before them")
    parser.add_argument("--database", default=f"console_bench_{os.getpid()}")
    parser.add_argument("--keep-db", action="store_true", help="leave the database for a look afterwards")
    parser.add_argument(
        "--explain", action="store_true", help="print EXPLAIN ANALYZE of each query on jobs at the largest size"
    )
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if sizes != sorted(sizes):
        parser.error("--sizes must ascend (the database grows from one to the next)")

    with ListStack(args.database, keep_db=args.keep_db) as stack:
        import requests
        from django.contrib.auth import get_user_model
        from django.test import Client
        from django.utils import timezone

        from jobs.models import Workspace
        from jobs.views.list import PAGE_SIZE

        user = get_user_model().objects.get(username="bench")
        workspace = Workspace.objects.get(project_id=stack.project_id)
        cat = Catalogue(user, workspace)
        rng = random.Random(SEED)
        now = timezone.now()

        page_session = requests.Session()
        page_session.headers["Cookie"] = stack.session_cookie()
        api_session = requests.Session()
        api_session.headers["Authorization"] = f"Token {stack.token}"
        page_client = Client(HTTP_HOST="127.0.0.1")
        page_client.force_login(user)
        api_client = Client(HTTP_HOST="127.0.0.1", HTTP_AUTHORIZATION=f"Token {stack.token}")
        endpoints = [
            Endpoint("page", "/", page_session, page_client, PAGE_SIZE),
            Endpoint("api", f"/v2/{stack.project_id}/training-jobs", api_session, api_client, 50),
        ]

        # results[(endpoint, case)][size] = (times, rows shown, queries, sql ms)
        results: dict[tuple[str, str], dict[int, tuple]] = {}
        sqls: dict[tuple[str, str], list[str]] = {}
        made = 0
        for size in sizes:
            t0 = time.monotonic()
            make_jobs(cat, made, size - made, now, rng)
            made = size
            vacuum_analyze()
            print(f"{size:,} jobs in the database ({time.monotonic() - t0:.1f} s to add and vacuum); measuring")
            for endpoint in endpoints:
                timed = time_requests(stack, endpoint, args.warmup, args.requests)
                for label, qs in CASES:
                    queries, sql_ms, sql = count_queries(endpoint, qs)
                    results.setdefault((endpoint.label, label), {})[size] = (*timed[label], queries, sql_ms)
                    sqls[(endpoint.label, label)] = sql
        if args.explain:
            for (endpoint_label, label), sql in sqls.items():
                print(f"\n== {endpoint_label} {label}: the queries on jobs at {sizes[-1]:,} jobs")
                for statement in sql:
                    if '"jobs_trainingjob"' in statement:
                        print(statement[:160] + " ...")
                        print(explain(statement))

    return report(results, sizes, args.requests)


def report(results, sizes: list[int], n: int) -> int:
    largest, smallest = sizes[-1], sizes[0]
    print()
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"First page, p50/p95 in ms over {n} requests each over HTTP (daphne, DEBUG off); queries per request")
    print(f"({os.cpu_count()} CPUs, load average {load} at the end)")
    size_heads = " | ".join(f"{s:,} jobs p50/p95" for s in sizes)
    print(
        f"| endpoint | case | rows | queries at {', '.join(f'{s:,}' for s in sizes)} | {size_heads} | "
        f"p95 {largest:,}/{smallest:,} | SQL ms at {largest:,} | verdict |"
    )
    print("|" + "---|" * (7 + len(sizes)))
    failed = []
    for (endpoint, label), by_size in results.items():
        counts = [by_size[s][2] for s in sizes]
        constant = len(set(counts)) == 1
        p95 = {s: percentile(by_size[s][0], 95) for s in sizes}
        cells = " | ".join(f"{statistics.median(by_size[s][0]):.1f}/{p95[s]:.1f}" for s in sizes)
        fast = p95[largest] < TARGET_P95_MS
        verdict = (
            "met"
            if fast and constant
            else "MISSED: "
            + ", ".join(
                ([f"p95 {p95[largest]:.0f} ms"] if not fast else []) + ([f"queries {counts}"] if not constant else [])
            )
        )
        if not (fast and constant):
            failed.append(f"{endpoint} {label}")
        print(
            f"| {endpoint} | {label} | {by_size[largest][1]} | {' / '.join(map(str, counts))} | {cells} | "
            f"{p95[largest] / p95[smallest]:.2f}x | {by_size[largest][3]:.1f} | {verdict} |"
        )
    worst = max(((percentile(v[largest][0], 95), k) for k, v in results.items()), key=lambda t: t[0])
    print(f"\nslowest first page at {largest:,} jobs: {worst[1][0]} {worst[1][1]}, p95 {worst[0]:.1f} ms")
    print(f"target: p95 < {TARGET_P95_MS:.0f} ms at {largest:,} jobs and the same query count at every size")
    if failed:
        print("FAIL: " + "; ".join(failed))
        return 1
    print("PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())
