"""The create wizard's server side (jobs/views/create.py, jobs/wizard.py): steps, actions,
per-field validation, dependent fields, templates, scenarios, env import, review, copy.
The browser walk is tests/test_browser_wizard.py."""

from __future__ import annotations

import json
import re
from html import unescape as html_unescape

import pytest
from django.test import Client

from jobs import wizard
from jobs.forms import JobCreateForm
from jobs.models import PresetTemplate, ResourcePool, TrainingJob
from tests.helpers import BUSYBOX, api_client

# A test that submits a job has the worker (transactional: it settles the jobs it starts); the rest roll back.
pytestmark = [pytest.mark.django_db]
runs_jobs = pytest.mark.usefixtures("worker")

HX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def owner_client(demo) -> Client:
    client = Client()
    client.login(username="owner", password="owner-password")
    return client


def base_data(demo, **extra) -> dict:
    data = {
        "workspace": str(demo.workspace.id),
        "training_mode": "custom",
        "name": "wizard-job",
        "image_source": "custom",
        "image": BUSYBOX,
        "command": "echo hi",
        "pool_type": "public",
        "node_count": "1",
        "visibility": "workspace",
    }
    return data | extra


def current_step(response) -> str:
    return re.search(r'name="step" value="([a-z]+)"', response.content.decode())[1]


def section(response, slug: str) -> str:
    html = response.content.decode()
    if slug == "review":  # holds sections of its own
        return html[html.index('id="step-review"') : html.index('class="actions wizard-actions"')]
    return re.search(rf'<section class="step" id="step-{slug}".*?</section>', html, re.S)[0]


def test_every_form_field_is_on_exactly_one_step():
    placed = [name for step in wizard.STEPS for name in step.fields]
    assert sorted(placed) == sorted(set(placed)), "a field is on two steps"
    assert set(placed) == set(JobCreateForm.base_fields), "a form field is on no step, or a step names no field"
    assert [s.slug for s in wizard.STEPS] == [
        "mode",
        "basic",
        "training",
        "resources",
        "data",
        "artifacts",
        "ha",
        "access",
        "observe",
        "more",
        "review",
    ]
    for name, rule in wizard.SHOW_WHEN.items():
        assert name in wizard.STEP_OF_FIELD
        for term in rule.split("|"):
            assert term.strip().partition("=")[0] in wizard.STEP_OF_FIELD, rule


def test_the_page_opens_on_the_first_step_with_the_others_hidden(owner_client):
    response = owner_client.get("/jobs/create/")
    assert response.status_code == 200
    html = response.content.decode()
    assert current_step(response) == "mode"
    assert re.search(r'<section class="step" id="step-mode"[^>]*>', html)[0].count("hidden") == 0
    assert 'id="step-basic" aria-labelledby="title-basic" hidden' in html
    # A default name is proposed (SPEC §3), and dedicated-only fields start hidden and disabled.
    assert re.search(r'name="name" value="job-\d{8}-[a-z0-9]{4}"', html)
    assert re.search(r'id="field-pool" data-show-when="pool_type=dedicated" hidden disabled', html)


def test_next_stays_on_a_step_with_errors_and_says_why(demo, owner_client):
    data = base_data(demo, name="bad name!", step="basic", action="next")
    response = owner_client.post("/jobs/create/", data, **HX)
    assert response.status_code == 200
    assert current_step(response) == "basic"
    assert "Name must be 1-64 characters" in section(response, "basic")
    # Only this step's messages: nothing about later steps yet.
    assert 'class="error"' not in section(response, "training")
    response = owner_client.post("/jobs/create/", data | {"name": "good-name"}, **HX)
    assert current_step(response) == "training"
    assert 'value="good-name"' in response.content.decode()
    assert not TrainingJob.objects.exists()


def test_back_and_goto_keep_what_was_typed_without_validating(demo, owner_client):
    data = base_data(demo, name="bad name!", description="kept", step="training", action="back")
    response = owner_client.post("/jobs/create/", data, **HX)
    assert current_step(response) == "basic"
    html = response.content.decode()
    assert 'value="bad name!"' in html and 'value="kept"' in html
    assert "Name must be" not in html
    response = owner_client.post("/jobs/create/", data | {"action": "goto:ha"}, **HX)
    assert current_step(response) == "ha"


def test_leaving_a_field_returns_its_messages_only(demo, owner_client):
    data = base_data(demo, name="x" * 65, fault_tolerance="on", max_restarts="129")
    response = owner_client.post("/jobs/create/validate/?field=name", data, **HX)
    html = response.content.decode()
    assert html.startswith('<div class="errors" id="errors-name"')
    assert "Name must be 1-64 characters" in html
    assert "Max restarts" not in html
    response = owner_client.post("/jobs/create/validate/?field=max_restarts", data, **HX)
    assert "Max restarts must be between 1 and 128" in response.content.decode()
    response = owner_client.post("/jobs/create/validate/?field=command", data, **HX)
    assert response.content.decode().strip() == '<div class="errors" id="errors-command" aria-live="polite"></div>'


def test_dependent_fields_follow_their_controllers(demo, owner_client):
    def shown(response, name):
        tag = re.search(rf'<fieldset class="field[^"]*" id="field-{name}"[^>]*>', response.content.decode())[0]
        return "hidden" not in tag

    data = base_data(demo, step="resources", action="goto:resources")
    public = owner_client.post("/jobs/create/", data, **HX)
    assert shown(public, "flavor") and not shown(public, "pool") and not shown(public, "custom_cpus")
    dedicated = owner_client.post("/jobs/create/", data | {"pool_type": "dedicated", "spec_type": "custom"}, **HX)
    assert shown(dedicated, "pool") and shown(dedicated, "custom_cpus") and not shown(dedicated, "flavor")
    assert shown(dedicated, "retention_hours") and not shown(public, "retention_hours")
    chain = owner_client.post("/jobs/create/", data | {"publish_as": "new"}, **HX)
    assert not shown(chain, "model_name"), "publish_as counts only while auto-publish is on"
    chain = owner_client.post("/jobs/create/", data | {"auto_publish": "on", "publish_as": "new"}, **HX)
    assert shown(chain, "model_name") and not shown(chain, "publish_model")


def test_a_preset_template_fills_the_training_configuration(demo, owner_client):
    PresetTemplate.objects.create(
        name="qwen-sft",
        brand="Qwen",
        description="Fine tune",
        image=demo.workspace and __import__("jobs.models", fromlist=["PresetImage"]).PresetImage.objects.first(),
        command="cd ${MA_JOB_DIR}/code && python train.py",
        environments=[{"name": "EPOCHS", "value": "3"}],
    )
    data = base_data(demo, step="training", action="apply-template", preset_template="qwen-sft", command="")
    response = owner_client.post("/jobs/create/", data, **HX)
    html = section(response, "training")
    assert "cd ${MA_JOB_DIR}/code &amp;&amp; python train.py" in html
    assert 'name="environments-0-name" value="EPOCHS"' in html
    assert "Filled from the preset template qwen-sft" in response.content.decode()


def test_a_scenario_fills_high_availability_and_shows_its_checklist(demo, owner_client):
    data = base_data(demo, step="mode", action="apply-scenario", scenario="multi_node")
    response = owner_client.post("/jobs/create/", data, **HX)
    html = response.content.decode()
    ha = section(response, "ha")
    assert re.search(r'name="fault_tolerance"[^>]*checked', ha)
    assert re.search(r'name="max_restarts" value="10"', ha)
    assert re.search(r'name="unconditional_restart"[^>]*checked', ha)
    assert re.search(r'name="hang_restart"[^>]*checked', ha)
    assert "Checkpoints are saved to reliable shared storage." in html
    assert current_step(response) == "mode"


def test_env_file_import_appends_and_refuses_a_file_beyond_100_whole(demo, owner_client):
    from django.core.files.uploadedfile import SimpleUploadedFile

    data = base_data(demo, step="training", action="import-env")
    data |= {"environments-0-name": "KEEP", "environments-0-value": "1"}
    upload = SimpleUploadedFile("vars.env", b"A=1\nexport B='two'\n# comment\n")
    response = owner_client.post("/jobs/create/", data | {"env_file": upload}, **HX)
    html = section(response, "training")
    assert 'value="KEEP"' in html and 'value="A"' in html and 'value="two"' in html
    too_many = "".join(f"V{i}=x\n" for i in range(100)).encode()
    response = owner_client.post("/jobs/create/", data | {"env_file": SimpleUploadedFile("big.env", too_many)}, **HX)
    html = section(response, "training")
    assert "at most 100 env vars in total. Nothing was imported." in html
    assert 'value="V0"' not in html and 'value="KEEP"' in html


def test_env_file_import_refuses_a_file_bigger_than_100_env_vars_can_be(demo, owner_client):
    """The import reads at most its cap (+1 byte): a bigger file is refused with a message naming
    the field and the limit, and nothing changes; the biggest legitimate file still imports."""
    from django.core.files.uploadedfile import SimpleUploadedFile

    from jobs import validators as v
    from jobs.forms import ENV_FILE_MAX_BYTES, ENV_FILE_NAME_ALLOWANCE

    refused = f"Import env vars from a file: refused, the file is larger than {ENV_FILE_MAX_BYTES:,} bytes"
    data = base_data(demo, step="training", action="import-env")
    data |= {"environments-0-name": "KEEP", "environments-0-value": "1"}
    # Two valid lines, then padding in a comment: only its size is wrong.
    oversized = b"A=1\nB=2\n#" + b"x" * ENV_FILE_MAX_BYTES + b"\n"
    response = owner_client.post("/jobs/create/", data | {"env_file": SimpleUploadedFile("big.env", oversized)}, **HX)
    html = html_unescape(section(response, "training"))
    assert refused in html and "Nothing was imported." in html
    assert 'value="KEEP"' in html and 'value="A"' not in html and 'value="B"' not in html

    # A plain submit with the same file: refused the same way, no job.
    plain = base_data(demo) | {"env_file": SimpleUploadedFile("big.env", oversized)}
    response = owner_client.post("/jobs/create/", plain)
    assert response.status_code == 400
    assert refused in html_unescape(response.content.decode())
    assert not TrainingJob.objects.exists()

    # 100 variables of the longest name the cap allows for and the longest value, in 4-byte characters.
    biggest = "\ufeff" + "".join(
        f"export {'N' * (ENV_FILE_NAME_ALLOWANCE - 3)}{i:03d}='{'😀' * v.ENV_VALUE_MAX}'\r\n" for i in range(100)
    )
    assert len(biggest.encode()) == ENV_FILE_MAX_BYTES
    del data["environments-0-name"], data["environments-0-value"]
    response = owner_client.post(
        "/jobs/create/", data | {"env_file": SimpleUploadedFile("max.env", biggest.encode())}, **HX
    )
    html = section(response, "training")
    assert "Nothing was imported" not in html and html.count("😀" * v.ENV_VALUE_MAX) == 100


def test_env_file_read_stops_one_byte_past_the_cap():
    """Even when the upload does not say its size, no more than the cap and one byte is read."""
    import io

    from django.core.exceptions import ValidationError

    from jobs.forms import ENV_FILE_MAX_BYTES, read_env_file

    class Upload(io.BytesIO):
        size = None
        read_bytes = 0

        def read(self, size=-1):
            data = super().read(size)
            self.read_bytes += len(data)
            return data

    upload = Upload(b"A=1\n" * ENV_FILE_MAX_BYTES)
    with pytest.raises(ValidationError, match=f"larger than {ENV_FILE_MAX_BYTES:,} bytes"):
        read_env_file(upload)
    assert upload.read_bytes == ENV_FILE_MAX_BYTES + 1
    assert read_env_file(Upload("\ufeffA=é\n".encode())) == "A=é\n"


def test_review_shows_the_configuration_and_a_body_the_api_accepts(demo, owner_client):
    pool = ResourcePool.objects.create(name="dedi", kind="dedicated", node_cpus=8, node_memory_gb=32)
    data = base_data(
        demo,
        step="more",
        action="next",
        description="review me",
        pool_type="dedicated",
        pool=pool.name,
        spec_type="custom",
        custom_cpus="2",
        custom_memory_gb="4",
        fault_tolerance="on",
        max_restarts="5",
        hang_restart="on",
        **{"environments-0-name": "SECRET", "environments-0-value": "s3", "environments-0-sensitive": "on"},
        **{"tags-0-key": "team", "tags-0-value": "nlp"},
    )
    response = owner_client.post("/jobs/create/", data, **HX)
    assert current_step(response) == "review"
    html = section(response, "review")
    assert "review me" in html and "SECRET=******" in html
    body = json.loads(html_unescape(re.search(r'<pre class="cmd" id="rest-body-json">(.*?)</pre>', html, re.S)[1]))
    assert body["metadata"]["annotations"]["fault-tolerance/job-retry-num"] == "5"
    assert body["algorithm"]["environments"] == [{"name": "SECRET", "value": "s3", "sensitive": True}]
    created = api_client(demo.token).post(f"/v2/{demo.workspace.project_id}/training-jobs", body, format="json")
    assert created.status_code == 201, created.json()
    job = TrainingJob.objects.get(id=created.json()["metadata"]["id"])
    assert (job.pool, job.custom_cpus, job.max_restarts, job.hang_restart, job.tags) == (
        pool,
        2,
        5,
        True,
        [{"key": "team", "value": "nlp"}],
    )


@runs_jobs
def test_submit_creates_the_job_or_shows_the_first_step_with_errors(demo, owner_client):
    bad = base_data(demo, step="review", action="submit", command="", fault_tolerance="on", max_restarts="0")
    response = owner_client.post("/jobs/create/", bad, **HX)
    assert response.status_code == 400
    assert current_step(response) == "training"  # the first step with a message
    html = response.content.decode()
    assert "Start command is required" in html and "Max restarts must be between 1 and 128" in html
    assert not TrainingJob.objects.exists()
    response = owner_client.post("/jobs/create/", base_data(demo, step="review", action="submit"), **HX)
    job = TrainingJob.objects.get(name="wizard-job")
    assert response.status_code == 200 and response["HX-Redirect"] == f"/jobs/{job.id}/"
    assert job.created_by == demo.owner


@runs_jobs
def test_copy_prefills_from_a_visible_job_only(demo, owner_client):
    from tests.helpers import submit_job

    job = submit_job(
        demo,
        name="to-copy",
        visibility="creator",
        environments=[{"name": "K", "value": "secret", "sensitive": True}],
        fault_tolerance=True,
        max_restarts=9,
    )
    html = owner_client.get(f"/jobs/create/?copy={job.id}").content.decode()
    assert 'value="to-copy-copy"' in html and 'name="max_restarts" value="9"' in html
    assert "secret" not in html, "a sensitive value is never shown again"
    member = Client()
    member.login(username="member", password="member-password")
    assert member.get(f"/jobs/create/?copy={job.id}").status_code == 404


def test_the_pool_picker_shows_what_each_dedicated_pool_has_free(demo, owner_client):
    from jobs.models import DockerHost

    pool = ResourcePool.objects.create(name="gpus", kind="dedicated", node_cpus=16, node_memory_gb=128, node_gpus=8)
    DockerHost.objects.create(name="g1", base_url="unix:///nowhere.sock", pool=pool)
    DockerHost.objects.create(name="g2", base_url="unix:///nowhere.sock", pool=pool)
    data = base_data(demo, step="resources", action="goto:resources", pool_type="dedicated")
    html = section(owner_client.post("/jobs/create/", data, **HX), "resources")
    assert "gpus · 16 CPUs, 128 GB, 8 GPUs per node · 2/2 nodes free · 16 GPUs · 32 CPUs · 256 GB" in html
    assert 'value="test-pool"' not in html, "public pools are not offered as dedicated pools"


@runs_jobs
def test_the_job_page_shows_every_setting_grouped_like_the_wizard(demo, owner_client):
    from tests.helpers import submit_job

    job = submit_job(
        demo,
        name="shown",
        command="sleep 30",
        fault_tolerance=True,
        max_restarts=6,
        hang_restart=True,
        environments=[{"name": "K", "value": "hidden-value", "sensitive": True}, {"name": "A", "value": "1"}],
        tags=[{"key": "team", "value": "cv"}],
    )
    html = owner_client.get(f"/jobs/{job.id}/").content.decode()
    settings_html = html[html.index('id="job-configuration"') :]
    for text in ("Training configuration", "K=******", "A=1", "Max restarts</dt><dd>6", "team: cv"):
        assert text in settings_html, text
    assert "hidden-value" not in html
    assert 'data-step="resources"' in settings_html and "Resource pool</dt>" not in settings_html  # public pool
