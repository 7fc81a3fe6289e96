"""What a job leaves once it ended (SPEC §3): auto-publish of the final model, logs kept
permanently (exported to the log path) or deleted after the retention, and the log download
by time range. Real containers, a real worker and object storage on disk."""

from __future__ import annotations

import threading
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.conf import settings
from django.db import connection
from django.utils import timezone
from playwright.sync_api import expect

from jobs import storage
from jobs.models import EventKind, Flavor, Model, ModelVersion, Phase, TaskRun, TrainingJob
from jobs.runtime import logreading, outputs, reconcile
from jobs.runtime.logs import log_path
from tests.browser_page import log_in, shot
from tests.folders import bucket
from tests.helpers import api_client, api_log, reload, submit_job, wait_for

pytestmark = pytest.mark.django_db(transaction=True)

ARTIFACT_MOUNT = "/home/ma-user/out"
WRITE_ARTIFACT = f"echo weights > {ARTIFACT_MOUNT}/model.bin; echo trained"


# -- helpers ---------------------------------------------------------------------------------------------
def ended(job: TrainingJob) -> bool:
    """Ended as outputs.py counts it: final, or retained (helpers.ended: final only)."""
    return reload(job).phase in outputs.ENDED_PHASES


def api_job(demo, job: TrainingJob) -> dict:
    response = api_client(demo.token).get(f"/v2/{demo.workspace.project_id}/training-jobs/{job.id}")
    assert response.status_code == 200, response.content
    return response.json()


def text(response) -> str:
    return b"".join(response.streaming_content).decode() if response.streaming else response.content.decode()


def page(client, job: TrainingJob, tab: str = "overview") -> str:
    response = client.get(f"/jobs/{job.id}/", {"tab": tab})
    assert response.status_code == 200
    return response.content.decode()


def publishing_job(demo, **fields) -> TrainingJob:
    bucket("art-b")
    return submit_job(
        demo,
        **(
            dict(
                store_artifacts=True,
                artifact_path="obs://art-b/run/",
                artifact_mount_path=ARTIFACT_MOUNT,
                auto_publish=True,
                publish_as=TrainingJob.PublishAs.NEW,
                model_name="demo-model",
                model_type=Model.Type.OTHER,
                model_description="Trained by the outputs test.",
                command=WRITE_ARTIFACT,
            )
            | fields
        ),
    )


def iso(ns: int) -> str:
    """A time as the page's datetime-local inputs send it: no offset (the console's zone, UTC here),
    to the microsecond (truncated, as a user copies a time shown)."""
    seconds, rest = divmod(ns, 1_000_000_000)
    return datetime.fromtimestamp(seconds, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S") + f".{rest // 1000:06d}"


# -- auto-publish ----------------------------------------------------------------------------------------
def test_a_completed_job_publishes_its_artifacts_once_as_a_new_model(demo, worker, client):
    job = publishing_job(demo, name="publisher", version_description="first")
    wait_for(lambda: reload(job).published_version_id, timeout=60, message="the model published")
    assert job.phase == Phase.COMPLETED
    version = job.published_version
    assert (version.model.name, version.label, version.job_id) == ("demo-model", "V1", job.id)
    assert (version.model.owner, version.model.description) == (demo.owner, "Trained by the outputs test.")
    assert (version.artifact_path, version.description) == ("obs://art-b/run/", "first")
    assert (storage.local_path("obs://art-b/run/") / "model.bin").read_text() == "weights\n"
    event = job.events.get(kind=EventKind.MODEL_PUBLISHED)
    assert event.message == "Model published: demo-model V1"
    assert (event.data["model"], event.data["version"]) == ("demo-model", "V1")

    # Once: a re-run of the step (a second worker, a reconcile that comes back) publishes nothing more.
    assert not outputs.publish(job.id)
    assert not outputs.complete_outputs(job.id)
    assert not reconcile.complete_job_outputs()
    assert ModelVersion.objects.count() == 1 and job.events.filter(kind=EventKind.MODEL_PUBLISHED).count() == 1

    client.force_login(demo.owner)
    overview = page(client, job)
    assert 'id="publish-status" data-state="published"' in overview
    assert "Published <b>demo-model V1</b>" in overview
    body = api_job(demo, job)
    assert body["status"]["publish"] | {"published_at": None} == {
        "state": "published",
        "model": "demo-model",
        "version": "V1",
        "published_at": None,
    }
    assert body["spec"]["publish"]["version"] == "V1"  # what it created, not what it would create next


def test_a_new_version_of_a_chosen_model_and_nothing_from_a_failed_job(demo, worker, client):
    model = Model.objects.create(owner=demo.owner, name="base-model", description="x")
    ModelVersion.objects.create(model=model, number=1)
    versioned = publishing_job(demo, name="next-version", publish_as=TrainingJob.PublishAs.VERSION, publish_model=model)
    failed = publishing_job(demo, name="broken", model_name="never-made", command=f"{WRITE_ARTIFACT}; exit 3")
    wait_for(lambda: reload(versioned).published_version_id, timeout=60, message="V2 published")
    wait_for(lambda: ended(failed), timeout=60, message="the failed job to end")

    assert versioned.published_version.label == "V2" and versioned.published_version.model == model
    assert versioned.events.get(kind=EventKind.MODEL_PUBLISHED).message == "Model published: base-model V2"
    assert api_job(demo, versioned)["status"]["publish"]["version"] == "V2"

    assert failed.phase == Phase.FAILED
    assert not outputs.publish(failed.id)
    assert not Model.objects.filter(name="never-made").exists()
    assert not failed.events.filter(kind__in=[EventKind.MODEL_PUBLISHED, EventKind.MODEL_NOT_PUBLISHED]).exists()
    assert api_job(demo, failed)["status"]["publish"] == {
        "state": "not_published",
        "reason": "the job did not complete: only a completed job publishes.",
    }
    client.force_login(demo.owner)
    assert "Not published: the job did not complete" in page(client, failed)


def test_an_empty_artifact_folder_publishes_nothing_and_says_why(demo, worker):
    job = publishing_job(demo, name="no-output", artifact_path="obs://art-b/empty/", command="echo nothing written")
    wait_for(lambda: reload(job).publish_checked_at, timeout=60, message="auto-publish to run")
    assert job.phase == Phase.COMPLETED and job.published_version_id is None
    assert job.publish_note == "the artifact folder obs://art-b/empty/ is empty."
    event = job.events.get(kind=EventKind.MODEL_NOT_PUBLISHED)
    assert event.message == "Model not published: the artifact folder obs://art-b/empty/ is empty."
    assert not Model.objects.exists()


def _ended_row(demo, **fields) -> TrainingJob:
    """An ended job as the supervisor leaves it, without running it (the steps alone). It ended
    just now: inside reconcile's grace, so the worker's own reconcile leaves it to the test."""
    job = TrainingJob(
        workspace=demo.workspace, created_by=demo.owner, name="row", image="console/busybox:latest", command="true"
    )
    for field, value in (dict(phase=Phase.COMPLETED, ended_at=timezone.now()) | fields).items():
        setattr(job, field, value)
    job.save()
    return job


def test_two_workers_publishing_at_once_make_one_version(demo):
    (bucket("art-b") / "race").mkdir(exist_ok=True)
    (bucket("art-b") / "race" / "model.bin").write_text("w")
    job = _ended_row(
        demo,
        store_artifacts=True,
        artifact_path="obs://art-b/race/",
        auto_publish=True,
        model_name="raced",
        model_type=Model.Type.OTHER,
        model_description="d",
    )
    start = threading.Barrier(4)
    results: list[bool] = []

    def publish() -> None:
        try:
            start.wait()
            results.append(outputs.publish(job.id))
        finally:
            connection.close()

    threads = [threading.Thread(target=publish) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(results) == [False, False, False, True]
    assert ModelVersion.objects.filter(model__name="raced").count() == 1
    assert reload(job).published_version.label == "V1"


def test_reconcile_redoes_the_outputs_of_a_job_whose_task_was_lost(demo, worker):
    long_ago = timezone.now() - timezone.timedelta(minutes=1)  # past reconcile's grace
    (bucket("art-b") / "lost").mkdir(exist_ok=True)
    (bucket("art-b") / "lost" / "model.bin").write_text("w")
    job = _ended_row(
        demo,
        store_artifacts=True,
        artifact_path="obs://art-b/lost/",
        auto_publish=True,
        model_name="recovered",
        model_type=Model.Type.OTHER,
        model_description="d",
        ended_at=long_ago,
    )
    done = _ended_row(demo, name="done", auto_publish=True, publish_checked_at=long_ago, ended_at=long_ago)
    young = _ended_row(demo, name="young", auto_publish=True)  # finish()'s own task has its turn first
    failed = _ended_row(demo, name="failed", auto_publish=True, phase=Phase.FAILED, ended_at=long_ago)
    # The suite's worker runs this step too and may have queued the publish first: the publish is the test.
    reconcile.complete_job_outputs()
    wait_for(lambda: reload(job).published_version_id, message="the worker to publish")
    assert job.published_version.model.name == "recovered"
    for other in (done, young, failed):
        assert reload(other).published_version_id is None


# -- keep logs permanently ------------------------------------------------------------------------------------
def test_kept_logs_are_exported_per_instance_with_every_attempt(demo, worker, client):
    bucket("logs-b")
    job = submit_job(
        demo,
        name="kept",
        node_count=2,
        keep_logs=None,  # resolved: on, because a log path is given
        log_export_path="obs://logs-b/training/",
        command='echo "rank $RANK says hi"; echo "rank $RANK done"',
    )
    # Two attempts: the first process is SIGKILLed (transient), restarted at process level.
    retried = submit_job(
        demo,
        name="retried",
        keep_logs=True,
        log_export_path="obs://logs-b/training/",
        fault_tolerance=True,
        max_restarts=1,
        command='echo "attempt $MA_ATTEMPT"; [ "$MA_ATTEMPT" -ge 2 ] || kill -9 $$; echo "attempt $MA_ATTEMPT done"',
    )
    assert job.keep_logs is True
    wait_for(lambda: reload(job).logs_exported_at and reload(retried).logs_exported_at, timeout=90, message="exports")
    assert (job.phase, retried.phase) == (Phase.COMPLETED, Phase.COMPLETED)
    assert job.logs_export_error == retried.logs_export_error == ""
    folder = storage.local_path(f"obs://logs-b/training/kept-{job.id}/")
    assert sorted(p.name for p in folder.iterdir()) == ["worker-0.log", "worker-1.log"]
    for index in (0, 1):
        lines = (folder / f"worker-{index}.log").read_text().splitlines()
        assert lines[0].startswith("# attempt 1 on local, container tj-")
        assert lines[1:] == [f"rank {index} says hi", f"rank {index} done"]
    event = job.events.get(kind=EventKind.LOGS_EXPORTED)
    assert event.message == f"Logs exported to obs://logs-b/training/kept-{job.id}/"

    lines = (storage.local_path(f"obs://logs-b/training/retried-{retried.id}/") / "worker-0.log").read_text()
    lines = lines.splitlines()
    separators = [line for line in lines if line.startswith("# attempt ")]
    assert [s.split(" on ")[0] for s in separators] == ["# attempt 1", "# attempt 2"]
    ours = [line for line in lines if line.startswith("attempt ")]
    assert ours == ["attempt 1", "attempt 2", "attempt 2 done"]
    assert lines.index(separators[0]) < lines.index(ours[0]) < lines.index(separators[1]) < lines.index(ours[1])

    # Idempotent: done once; a forced re-run writes the same files again, nothing doubled.
    before = {p.name: p.read_text() for p in folder.iterdir()}
    assert not outputs.export_logs(job.id)
    TrainingJob.objects.filter(id=job.id).update(logs_exported_at=None)
    outputs.export_logs(job.id)  # (the worker's reconcile may be the one that does it)
    wait_for(lambda: reload(job).logs_exported_at, message="the export done again")
    assert {p.name: p.read_text() for p in folder.iterdir()} == before

    # Kept logs are never deleted by retention.
    TrainingJob.objects.filter(id=job.id).update(ended_at=timezone.now() - timezone.timedelta(days=400))
    assert not reconcile.delete_expired_logs()
    assert not outputs.delete_logs(job.id)
    assert all(log_path(run).exists() for run in TaskRun.objects.filter(attempt__job=job))

    logs = api_job(demo, job)["status"]["logs"]
    assert (logs["state"], logs["keep_permanently"]) == ("exported", True)
    assert logs["export_path"] == f"obs://logs-b/training/kept-{job.id}/"
    assert api_job(demo, job)["spec"]["keep_logs"] is True
    client.force_login(demo.owner)
    assert f"exported to <code>obs://logs-b/training/kept-{job.id}/</code>" in page(client, job)


def test_an_export_to_a_bucket_that_is_gone_keeps_the_logs_here(demo, worker):
    job = _ended_row(demo, keep_logs=True, log_export_path="obs://gone-b/logs/")
    assert outputs.export_logs(job.id)
    reload(job)
    assert job.logs_exported_at and "the bucket of 'obs://gone-b/logs/" in job.logs_export_error
    assert job.events.get(kind=EventKind.LOGS_EXPORT_FAILED).message.endswith("The logs stay in the console.")
    assert outputs.logs_status(job)["state"] == "export_failed"


def test_keep_logs_resolves_on_for_npu_flavors_and_a_log_path(demo):
    npu = Flavor.objects.create(name="npu.1", npu=True, gpus=1)
    cpu = Flavor.objects.create(name="cpu.1")
    cases = {
        "npu": (dict(flavor=npu), True),
        "path": (dict(log_export_path="obs://logs-b/x/"), True),
        "cpu": (dict(flavor=cpu), False),
        "none": ({}, False),
        "off": (dict(keep_logs=False, log_export_path="obs://logs-b/x/", flavor=npu), False),
        "on": (dict(keep_logs=True, log_export_path="obs://logs-b/x/"), True),
    }
    jobs = {name: _ended_row(demo, name=name, **({"keep_logs": None} | fields)) for name, (fields, _) in cases.items()}
    for name, (_, expected) in cases.items():
        assert outputs.keeps_logs(jobs[name]) is expected, name
    keeping = set(TrainingJob.objects.filter(outputs.keeps_logs_q()).values_list("name", flat=True))
    dropping = set(TrainingJob.objects.filter(outputs.drops_logs_q()).values_list("name", flat=True))
    assert keeping == {name for name, (_, expected) in cases.items() if expected}
    assert dropping == set(cases) - keeping


# -- logs deleted by retention ------------------------------------------------------------------------------
def test_logs_not_kept_are_deleted_after_the_retention_then_gone(demo, worker, client, settings):
    job = submit_job(demo, name="short-lived", command="echo one; echo two")
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    run = TaskRun.objects.get(attempt__job=job)
    assert job.keep_logs is False and log_path(run).exists()
    assert text(api_log(demo, job)) == "one\ntwo\n"
    logs = api_job(demo, job)["status"]["logs"]
    assert (logs["state"], logs["retention"]) == ("kept", "30 days") and logs["delete_at"]

    settings.LOG_RETENTION_S = 3600  # in this process: the test runs the reconcile step itself
    assert not reconcile.delete_expired_logs()
    settings.LOG_RETENTION_S = 1
    wait_for(reconcile.delete_expired_logs, timeout=15, message="the retention to pass")
    wait_for(lambda: reload(job).logs_deleted_at, message="the worker to delete the logs")
    assert not log_path(run).exists()
    assert job.events.get(kind=EventKind.LOGS_DELETED).message.startswith("Logs deleted by retention")
    assert not outputs.delete_logs(job.id)  # once

    refused = api_log(demo, job)
    assert refused.status_code == 410
    assert "deleted by retention" in refused.json()["error_msg"]
    client.force_login(demo.owner)
    download = client.get(f"/jobs/{job.id}/logs/0/download/")
    assert download.status_code == 410 and "deleted by retention" in download.content.decode()
    logs_tab = page(client, job, "logs")
    assert 'id="logs-deleted"' in logs_tab and "deleted by retention on" in logs_tab
    assert 'id="log-download"' not in logs_tab
    assert 'id="logs-status" data-state="deleted"' in page(client, job)
    assert api_job(demo, job)["status"]["logs"]["state"] == "deleted"


def test_the_worker_deletes_logs_past_the_default_retention_by_itself(demo, worker):
    job = submit_job(demo, name="old", command="echo old")
    wait_for(lambda: ended(job), timeout=60, message="the job to end")
    long_ago = timezone.now() - timezone.timedelta(seconds=outputs.log_retention_s() + 60)
    TrainingJob.objects.filter(id=job.id).update(ended_at=long_ago)
    wait_for(lambda: reload(job).logs_deleted_at, timeout=20, message="the worker's reconcile to delete the logs")
    assert not log_path(TaskRun.objects.get(attempt__job=job)).exists()


# -- log download by time range -----------------------------------------------------------------------------
def test_log_download_by_time_range_on_and_off(demo, worker, client):
    command = "echo early; sleep 1; echo late"
    on = submit_job(demo, name="ranged", log_time_range_download=True, command=command)
    off = submit_job(demo, name="whole", command=command)
    wait_for(lambda: ended(on) and ended(off), timeout=60, message="both jobs to end")
    run = TaskRun.objects.get(attempt__job=on)
    early, late = (line.ts_ns for line in logreading.iter_log(run))
    middle = (early + late) // 2

    # API: milliseconds or ISO 8601, either end open.
    assert text(api_log(demo, on, start_time=str(middle // 1_000_000))) == "late\n"
    assert text(api_log(demo, on, end_time=iso(middle))) == "early\n"
    assert text(api_log(demo, on, start_time=iso(early), end_time=iso(late))) == "early\nlate\n"
    assert text(api_log(demo, on)) == "early\nlate\n"
    bad = api_log(demo, on, start_time="yesterday")
    assert bad.status_code == 400 and bad.json()["error_msg"].startswith("start_time: start_time must be a date")
    assert api_log(demo, on, start_time="²").status_code == 400  # a digit to isdigit(), not to int()
    assert text(api_log(demo, on, end_time="9" * 30)) == "early\nlate\n"  # past a bigint: to the end
    backwards = api_log(demo, on, start_time=iso(late), end_time=iso(early))
    assert backwards.status_code == 400 and "end_time must not be before start_time" in backwards.json()["error_msg"]

    refused = api_log(demo, off, start_time=iso(early))
    assert refused.status_code == 400
    assert refused.json()["errors"] == {
        "log_time_range_download": [
            "Log download by time range is off for this job (setting log_time_range_download): "
            "download the whole log instead."
        ]
    }
    assert text(api_log(demo, off)) == "early\nlate\n"

    # The page: the form where it is on (the download route takes the same parameters), the whole log only where off.
    client.force_login(demo.owner)
    logs_tab = page(client, on, "logs")
    assert 'id="log-range"' in logs_tab and 'name="start_time"' in logs_tab and 'id="log-range-off"' not in logs_tab
    ranged = client.get(f"/jobs/{on.id}/logs/0/download/", {"start_time": iso(middle), "end_time": ""})
    assert ranged.status_code == 200
    lines = text(ranged).splitlines()
    assert lines[0].startswith("# attempt 1 on local") and lines[1:] == ["late"]
    assert 'filename="ranged-worker-0-range.log"' in ranged["Content-Disposition"]
    off_tab = page(client, off, "logs")
    assert 'id="log-range-off"' in off_tab and 'id="log-range"' not in off_tab
    refused_page = client.get(f"/jobs/{off.id}/logs/0/download/", {"start_time": iso(early)})
    assert refused_page.status_code == 400 and "log_time_range_download" in refused_page.content.decode()
    assert client.get(f"/jobs/{off.id}/logs/0/download/").status_code == 200
    assert "Log download by time range</dt><dd>off" in page(client, off)


def test_duration_text_and_time_parsing():
    assert outputs.duration_text(30 * 86400) == "30 days"
    assert outputs.duration_text(3600) == "1 hour"
    assert outputs.duration_text(5) == "5 seconds"
    assert logreading.parse_time("1000", "start_time") == 1_000_000_000
    assert logreading.parse_time("1970-01-01T00:00:01Z", "x") == 1_000_000_000
    assert logreading.parse_time("1970-01-01 01:00:01.5+01:00", "x") == 1_500_000_000
    # An end takes in the whole unit it names.
    assert logreading.parse_time("1970-01-01T00:00:01", "x", end=True) == 1_999_999_999
    assert logreading.parse_time("1970-01-01T00:01", "x", end=True) == 119_999_999_999
    assert logreading.parse_time("1970-01-01T00:00:01.250Z", "x", end=True) == 1_250_999_999
    assert logreading.parse_time("1970-01-01", "x", end=True) == 86400 * 10**9 - 1
    assert logreading.parse_time("1000", "x", end=True) == 1_000_999_999
    with pytest.raises(logreading.LogRequestRefused) as refused:
        logreading.parse_time("noon", "end_time")
    assert (refused.value.status, refused.value.field) == (400, "end_time")
    # What a caller types is refused or bounded, never a 500: a digit int() refuses, more digits
    # than int() reads, and times past what a line's stamp (a bigint) holds.
    for value in ("²", "1²", "9" * 5000):
        if value.isascii():
            assert logreading.parse_time(value, "end_time") == 2**63 - 1
        else:
            with pytest.raises(logreading.LogRequestRefused):
                logreading.parse_time(value, "end_time")
    assert logreading.parse_time("99999999999999", "end_time") == 2**63 - 1
    assert logreading.parse_time("0" * 30 + "1000", "start_time") == 1_000_000_000  # zeros are not digits of it
    assert logreading.parse_time("9999-12-31", "end_time", end=True) == 2**63 - 1
    assert logreading.parse_time("0001-01-01", "start_time") == -(2**63 - 1)


# -- the page, in a browser -------------------------------------------------------------------------------
@pytest.mark.browser
def test_the_overview_shows_the_published_model_without_a_reload(demo, new_page):
    # The job waits for the test's go-ahead: the page must see it running, however slow the machine.
    go = "until [ -e /job-data/go ]; do sleep 0.1; done"
    job = publishing_job(
        demo, name="live", log_time_range_download=True, command=f"{go}; {WRITE_ARTIFACT}", version_description="v"
    )
    page = new_page()
    log_in(page, "owner", "owner-password")
    page.goto(f"/jobs/{job.id}/")
    expect(page.locator("#publish-status")).to_contain_text("New model demo-model (V1), published when the job")
    wait_for(lambda: Path(settings.JOB_DATA_ROOT, str(job.id)).is_dir(), message="the job's data dir")
    Path(settings.JOB_DATA_ROOT, str(job.id), "go").touch()
    # The job socket says the job changed; the Outputs section asks again until it settled.
    expect(page.locator("#publish-status")).to_have_text("Published demo-model V1")
    expect(page.locator("#logs-status")).to_contain_text("then deleted by retention (30 days after the job ended")
    shot(page, "job-outputs-overview")
    page.get_by_role("link", name="Logs").click()
    expect(page.locator("#log-range")).to_be_visible()
    expect(page.locator("#log-lines")).to_contain_text("trained")
    shot(page, "job-outputs-logs-time-range")
    with page.expect_popup() as opened:  # the form's defaults: from the job's creation to its end
        page.get_by_role("button", name="Download time range").click()
    expect(opened.value.locator("body")).to_contain_text("trained")
