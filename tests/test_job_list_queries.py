"""The job list's first page costs the same SQL queries whatever the number of jobs (SPEC §3 "quota":
10,000 jobs per account): the list page and the API list, unfiltered, filtered and sorted, with N
and with 10N jobs that use every relation the rows show. bench/job_list.py times the same pages at
10, 1,000 and 10,000 jobs."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.authtoken.models import Token

from faulttolerance.models import RecoveryRecord
from jobs.models import (
    Attempt,
    DockerHost,
    FileSystem,
    Flavor,
    KeyPair,
    Model,
    ModelVersion,
    Phase,
    PresetImage,
    PresetTemplate,
    ResourcePool,
    TaskRun,
    TrainingJob,
    Workspace,
)
from jobs.views.list import PAGE_SIZE
from tests.helpers import api_client

pytestmark = [pytest.mark.django_db]

N = 5  # below a page of either list, so 10N adds rows to the very page measured
QUERIES = [
    "",
    "phase=Completed",
    "phase=Completed,Failed",
    "name=job",
    "sort_by=create_time&order=asc",
    "sort_by=create_time&order=desc",
    "sort_by=duration&order=desc",
    "sort_by=duration&order=asc",
    "phase=Failed&name=job&sort_by=duration",
]
PHASES = [Phase.COMPLETED, Phase.FAILED, Phase.RUNNING, Phase.PENDING, Phase.COMPLETED_RETAINED]


class World:
    pass


@pytest.fixture
def world() -> World:
    """A member of a workspace and everything a job may point at."""
    w = World()
    w.user = get_user_model().objects.create_user("lister", password="lister-password")
    w.workspace = Workspace.objects.create(name="listing")
    w.workspace.members.add(w.user)
    w.other = get_user_model().objects.create_user("colleague", password="colleague-password")
    w.workspace.members.add(w.other)
    w.token = Token.objects.create(user=w.user).key
    w.host = DockerHost.objects.create(name="local", base_url="unix:///var/run/docker.sock")
    w.pool = ResourcePool.objects.create(name="dedicated", kind=ResourcePool.Kind.DEDICATED)
    w.flavor = Flavor.objects.create(name="npu.8", cpus=8, memory_mb=8192, gpus=8, npu=True)
    w.image = PresetImage.objects.create(name="python", image_ref="console/python:3.11")
    w.template = PresetTemplate.objects.create(name="spiral-mlp", image=w.image)
    w.file_system = FileSystem.objects.create(name="shared", source="/srv/shared")
    w.key_pair = KeyPair.objects.create(
        owner=w.user,
        name="laptop",
        public_key="ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl me@laptop",
    )
    w.base_model = Model.objects.create(owner=w.user, name="base", type=Model.Type.TEXT_GENERATION)
    w.model = Model.objects.create(owner=w.user, name="spiral")
    w.versions = [ModelVersion.objects.create(model=w.model, number=n) for n in (1, 2)]
    w.made = 0
    return w


def add_jobs(w: World, count: int) -> None:
    """Jobs that use every relation the list page and the API's representation read, some of them
    with attempts, task runs and recovery records, and creator-only jobs of a colleague."""
    now = timezone.now()
    jobs = []
    for i in range(w.made, w.made + count):
        phase = PHASES[i % len(PHASES)]
        created = now - timedelta(hours=i + 1)
        started = None if phase == Phase.PENDING else created + timedelta(seconds=10)
        ended = started + timedelta(minutes=i + 1) if started and phase != Phase.RUNNING else None
        jobs.append(
            TrainingJob(
                workspace=w.workspace,
                created_by=w.user if i % 4 else w.other,
                visibility=TrainingJob.Visibility.CREATOR if i % 8 == 4 else TrainingJob.Visibility.WORKSPACE,
                name=f"job-{i:04d}",
                training_mode=TrainingJob.TrainingMode.FINETUNE,
                base_model=w.base_model,
                preset_template=w.template,
                image_source=TrainingJob.ImageSource.PRESET,
                preset_image=w.image,
                image="console/python:3.11",
                pool_type=TrainingJob.PoolType.DEDICATED,
                pool=w.pool,
                flavor=w.flavor,
                node_count=2,
                ssh_remote=True,
                ssh_key_pair=w.key_pair,
                observe_file_system=w.file_system,
                auto_publish=True,
                publish_as=TrainingJob.PublishAs.VERSION,
                publish_model=w.model,
                published_version=w.versions[0] if i % 2 else None,
                fault_tolerance=bool(i % 3),
                max_restarts=3,
                hang_restart=True,
                pod_retry_num=2,
                restarts_used=1 if started else 0,
                phase=phase,
                created_at=created,
                started_at=started,
                ended_at=ended,
            )
        )
    TrainingJob.objects.bulk_create(jobs)
    for job in jobs:
        if not job.started_at:
            continue
        first = Attempt.objects.create(job=job, number=1, state=Attempt.State.ENDED, outcome="failed")
        second = Attempt.objects.create(job=job, number=2, state=Attempt.State.ENDED)
        for attempt in (first, second):
            TaskRun.objects.create(attempt=attempt, index=0, host=w.host, container_name=f"c-{job.id}-{attempt.number}")
        RecoveryRecord.objects.create(
            job=job,
            failed_attempt=first,
            next_attempt=second,
            failure_class="oom",
            restart=True,
            decision="restart (container)",
            restarts_used_after=1,
            max_restarts=3,
        )
    w.made += count


def page_queries(w: World, qs: str) -> tuple[int, int]:
    """Queries of the list page's request, and the rows it showed."""
    client = Client()
    client.force_login(w.user)
    with CaptureQueriesContext(connection) as captured:
        response = client.get("/?" + qs)
    assert response.status_code == 200, response.content[:500]
    return len(captured), response.content.decode().count('id="job-row-')


def api_queries(w: World, qs: str) -> tuple[int, int]:
    client = api_client(w.token)
    with CaptureQueriesContext(connection) as captured:
        response = client.get(f"/v2/{w.workspace.project_id}/training-jobs?" + qs)
    assert response.status_code == 200, response.content[:500]
    return len(captured), len(response.json()["items"])


@pytest.mark.parametrize("measure", [page_queries, api_queries], ids=["page", "api"])
def test_first_page_costs_the_same_queries_for_n_and_10n_jobs(world, measure):
    add_jobs(world, N)
    small = {qs: measure(world, qs) for qs in QUERIES}
    add_jobs(world, 9 * N)
    large = {qs: measure(world, qs) for qs in QUERIES}
    for qs in QUERIES:
        (small_count, small_rows), (large_count, large_rows) = small[qs], large[qs]
        assert 0 < small_rows < large_rows, (qs, small_rows, large_rows)  # more rows on the same page
        assert small_count == large_count, (
            f"{qs or 'unfiltered'}: {small_count} queries for {N} jobs, {large_count} for {10 * N}"
        )
    # And few: session or token, user, permissions, the count, the page's ids, its rows (the page: + workspaces).
    assert max(count for count, _ in large.values()) <= 8


def test_page_shows_a_full_page_at_10n(world):
    add_jobs(world, 10 * N)
    _, rows = page_queries(world, "")
    assert rows == PAGE_SIZE


def test_api_list_names_the_version_a_pending_publish_will_create(world):
    """The list reads the model's latest version from its query's annotation; the detail view asks
    the model: both say the same (V3 after V1 and V2), and a published job names its version."""
    add_jobs(world, 4)
    client = api_client(world.token)
    base = f"/v2/{world.workspace.project_id}/training-jobs"
    items = client.get(base).json()["items"]
    assert items
    for item in items:
        detail = client.get(f"{base}/{item['metadata']['id']}").json()
        for body in (item, detail):
            for key in ("duration", "goodput"):  # a running job's grow between the two requests
                body["status"].pop(key)
        assert item == detail
    versions = {item["spec"]["publish"]["version"] for item in items}
    assert versions == {"V1", "V3"}
