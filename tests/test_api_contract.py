"""The API keeps its own contract: every operation of the served OpenAPI schema, called with
generated inputs by schemathesis, answers without a 5xx and with a response the schema describes.

The schema comes from the app (GET /api/schema/ through its WSGI handler), the calls go through
the same handler in this process, inside the test's transaction: real ids of the demo workspace
and of jobs in it, a workspace member's token. Nothing leaves the process: a created job queues
its Celery task after commit, and a plain `django_db` test never commits (no worker, no Docker).
"""

from __future__ import annotations

import zlib

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections, transaction
from django.test import Client
from django.utils import timezone
from hypothesis import HealthCheck, Phase, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

CHECKS = [not_a_server_error, response_schema_conformance, status_code_conformance]

schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())


@pytest.fixture
def in_process_requests():
    """Keep the test's database connection across requests, as django.test.Client does: the
    handler's close_old_connections would close it (a test transaction is not autocommit)."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    yield
    request_started.connect(close_old_connections)
    request_finished.connect(close_old_connections)


@pytest.fixture
def jobs(demo, in_process_requests, no_worker) -> list:
    """Jobs of the demo workspace the calls reach, in the shapes GET writes differently: a queued
    fault-tolerant job with Prometheus metrics, an attempt (instance worker-0, its log, a
    recovery record) and an event; an ended one whose logs retention deleted (DELETE deletes it,
    its log is 410); a dedicated job with every object of the body on (custom spec, affinity,
    artifacts, auto-publish, metrics by command, logs kept permanently)."""
    from faulttolerance.models import RecoveryRecord
    from jobs import storage
    from jobs.models import Attempt, JobEvent, Model, Phase, ResourcePool, TaskRun, TrainingJob
    from tests.helpers import submit_job

    queued = submit_job(
        demo,
        name="queued",
        fault_tolerance=True,
        max_restarts=3,
        metrics_mode=TrainingJob.MetricsMode.HTTP,
        metrics_path="/metrics",
        metrics_port=9100,
        log_time_range_download=True,
        notify_webhook_url="https://hooks.example.com/console",
    )
    failed = Attempt.objects.create(job=queued, number=1, state=Attempt.State.ENDED, outcome="failed")
    TaskRun.objects.create(attempt=failed, index=0, host=demo.host, container_name=f"c-{queued.id}-1")
    RecoveryRecord.objects.create(
        job=queued,
        failed_attempt=failed,
        failure_class="oom",
        task_index=0,
        exit_code=137,
        oom_killed=True,
        restart=True,
        decision="restart (container)",
        restarts_used_after=1,
        max_restarts=3,
    )
    JobEvent.objects.create(job=queued, kind="restarted", message="Restarted after an OOM kill.")

    ended = submit_job(demo, name="ended")
    now = timezone.now()
    TrainingJob.objects.filter(id=ended.id).update(phase=Phase.FAILED, ended_at=now, logs_deleted_at=now)
    attempt = Attempt.objects.create(job=ended, number=1, state=Attempt.State.ENDED, outcome="failed")
    TaskRun.objects.create(attempt=attempt, index=0, host=demo.host, container_name=f"c-{ended.id}-1")

    ResourcePool.objects.filter(id=demo.pool.id).update(kind=ResourcePool.Kind.DEDICATED)
    demo.pool.refresh_from_db()
    (storage.root() / "contract-b").mkdir(parents=True, exist_ok=True)
    dedicated = submit_job(
        demo,
        name="dedicated",
        pool_type=TrainingJob.PoolType.DEDICATED,
        pool=demo.pool,
        spec_type=TrainingJob.SpecType.CUSTOM,
        custom_cpus=1,
        custom_memory_gb=1,
        custom_gpus=0,
        affinity=TrainingJob.Affinity.AFFINITY,
        affinity_hosts=[demo.host.name],
        store_artifacts=True,
        artifact_path="obs://contract-b/out/",
        auto_publish=True,
        model_name="contract-model",
        model_type=Model.Type.OTHER,
        model_description="Published by the contract test.",
        metrics_mode=TrainingJob.MetricsMode.COMMAND,
        metrics_command="cat",
        metrics_args="/tmp/metrics.prom",
        keep_logs=True,
        log_export_path="obs://contract-b/logs/",
        retention_hours=2,
        auto_stop_hours=4,
    )
    return [queued, ended, dedicated]


def _real(case, demo, jobs) -> None:
    """Real ids in the path: the demo's project and one of its jobs (the same one for the same
    generated job_id, so an example replays the same), its instance worker-0."""
    path = case.path_parameters or {}
    if "project_id" in path:
        path["project_id"] = demo.workspace.project_id
    if "job_id" in path:
        path["job_id"] = str(jobs[zlib.crc32(str(path["job_id"]).encode()) % len(jobs)].id)
    if "task" in path:
        path["task"] = "worker-0"


# Small and repeatable: ~25 generated examples an operation (plus schemathesis' fixed coverage
# cases), the same ones every run. The examples share the fixtures' rows on purpose: each one
# rolls back what it changed.
EXAMPLES = settings(
    max_examples=25,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture(params=["owner-token"])
def member(request, demo) -> dict:
    """The headers of a member of the demo workspace (its owner, by token). A parameter of one value:
    with it each operation's test id names the operation (`[GET /v2/...][owner-token]`); without
    one, pytest 9 gives every operation of a schemathesis test the same id (xdist would merge them)."""
    return {"Authorization": f"Token {demo.token}"}


@pytest.mark.django_db
@schema.parametrize()
@EXAMPLES
def test_every_operation_keeps_the_schema(case, demo, jobs, member):
    _real(case, demo, jobs)
    # Each example starts from the same rows: what one call changed (a terminated or deleted job)
    # is rolled back before the next.
    with transaction.atomic():
        case.call_and_validate(headers=member, checks=CHECKS)
        transaction.set_rollback(True)


@pytest.fixture(params=["outsider", "anonymous", "session-without-csrf"])
def caller(request, demo) -> tuple[dict, int, bool]:
    """Another caller, how it calls, the status every documented call of it gets and whether only
    the calls that change something get it: a member of another workspace (404: it sees no such
    project), no credentials (401), a member signed in by the browser's session who sends no CSRF
    token (403 on POST and DELETE)."""
    if request.param == "outsider":
        return {"headers": {"Authorization": f"Token {demo.outsider_token}"}}, 404, False
    if request.param == "anonymous":
        return {}, 401, False
    client = Client()
    client.force_login(demo.member)
    session = django_settings.SESSION_COOKIE_NAME
    return {"cookies": {session: client.cookies[session].value}}, 403, True


# Generated calls only: the coverage phase's hundreds of boundary bodies per operation (the
# owner's test sends them) all meet the same refusal before a body is read, and cost 20 s of CPU.
OTHER_CALLERS = settings(EXAMPLES, max_examples=5, phases=[Phase.generate, Phase.shrink])


@pytest.mark.django_db
@schema.parametrize()
@OTHER_CALLERS
def test_other_callers_get_the_documented_errors(case, demo, jobs, caller):
    _real(case, demo, jobs)
    how, status, unsafe_only = caller
    with transaction.atomic():
        response = case.call_and_validate(checks=CHECKS, **how)
        transaction.set_rollback(True)
    documented = case.method.upper() == case.operation.method.upper()  # not a probe of another method
    if documented and not (unsafe_only and case.method.upper() in ("GET", "HEAD", "OPTIONS")):
        assert response.status_code == status, (case.method, case.formatted_path, response.text[:300])
