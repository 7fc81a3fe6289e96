"""The create wizard as a user walks it: a real Chromium against the real daphne, Celery
worker and Docker. Screenshots go to test-artifacts/wizard-*.png."""

from __future__ import annotations

import re

import pytest
from playwright.sync_api import expect

from jobs.models import Phase, PresetTemplate, ResourcePool, TrainingJob
from tests.browser_page import assert_not_reloaded, log_in, mark_document
from tests.helpers import BUSYBOX, wait_for
from tests.wizard_page import next_step, open_wizard, shot, step

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]


def test_walk_every_step_with_a_scenario_and_submit(demo, new_page, docker_client):
    ResourcePool.objects.create(name="gpu-pool", kind="dedicated", node_cpus=8, node_memory_gb=64, node_gpus=2)
    page = new_page()
    log_in(page, "owner", "owner-password")
    open_wizard(page)
    mark_document(page)
    shot(page, "01-mode")

    # Step 1: a scenario fills high availability and shows its checklist beside the form.
    page.locator(".scenario-cards").get_by_text("Multi-node multi-card").click()
    checklist = page.locator("#scenario-checklist")
    expect(checklist).to_contain_text("Checkpoints are saved to reliable shared storage.")
    checklist.get_by_label("The training script saves and resumes checkpoints.").check()
    shot(page, "02-scenario")

    # Basic information: a bad name is explained as soon as the field is left.
    section = next_step(page, "Basic information")
    name = section.get_by_label("Name")
    expect(name).to_have_value(re.compile(r"^job-\d{8}-[a-z0-9]{4}$"))
    name.fill("bad name!")
    section.get_by_label("Description").click()
    expect(page.locator("#errors-name")).to_contain_text("Name must be 1-64 characters")
    expect(page.locator("#field-name")).to_have_class(re.compile(r"\bhas-error\b"))
    shot(page, "03-name-error")
    name.fill("wizard-walk")
    section.get_by_label("Description").fill("Walked through every step.")
    expect(page.locator("#errors-name")).to_be_empty()
    expect(page.locator("#field-name")).not_to_have_class(re.compile(r"\bhas-error\b"))

    # Training configuration: custom image, command, env vars in rows.
    section = next_step(page, "Training configuration")
    section.get_by_label("Image", exact=True).fill(BUSYBOX)
    section.get_by_label("Start command").fill('echo "hello from $GREETING"; sleep 30')
    rows = section.locator("#rows-environments")
    rows.locator('input[name="environments-0-name"]').fill("GREETING")
    rows.locator('input[name="environments-0-value"]').fill("the wizard")
    section.get_by_role("button", name="+ Add a row").first.click()
    rows.locator('input[name="environments-1-name"]').fill("TOKEN")
    rows.locator('input[name="environments-1-value"]').fill("s3cret")
    rows.locator('input[name="environments-1-sensitive"]').check()
    shot(page, "04-training")

    # Resources: the dedicated-pool fields appear only for a dedicated pool.
    section = next_step(page, "Resources")
    expect(section.locator("#field-pool")).to_be_hidden()
    section.get_by_label("Resource pool type").select_option("dedicated")
    expect(section.locator("#field-pool")).to_be_visible()
    # The pool picker says what each dedicated pool has free.
    expect(section.locator("#field-pool")).to_contain_text("gpu-pool · 8 CPUs, 64 GB, 2 GPUs per node · 0/0 nodes free")
    expect(section.get_by_label("Priority")).to_be_visible()
    section.get_by_label("Resource pool type").select_option("public")
    expect(section.get_by_label("Priority")).to_be_hidden()
    expect(section.get_by_label("Instance count")).to_have_value("2")  # from the scenario
    section.get_by_label("Instance count").fill("1")
    shot(page, "05-resources")

    next_step(page, "Data")
    section = next_step(page, "Training artifacts")
    expect(section.get_by_label("Artifact storage path")).to_be_hidden()
    section.get_by_label("Store training artifacts").check()
    expect(section.get_by_label("Artifact storage path")).to_be_visible()
    section.get_by_label("Store training artifacts").uncheck()

    # High availability: as the scenario set it.
    section = next_step(page, "High availability")
    expect(section.get_by_label("Fault tolerance (automatic restart)")).to_be_checked()
    expect(section.get_by_label("Max restarts")).to_have_value("10")
    expect(section.get_by_label("Unconditional restart")).to_be_checked()
    expect(section.get_by_label("Hang restart")).to_be_checked()
    section.get_by_label("Max restarts").fill("4")
    shot(page, "06-ha")

    next_step(page, "Access")
    next_step(page, "Observability")
    section = next_step(page, "More settings")
    section.locator('input[name="tags-0-key"]').fill("team")
    section.locator('input[name="tags-0-value"]').fill("nlp")

    # Review: grouped by step, sensitive values masked, and the equivalent REST body.
    section = next_step(page, "Review and submit")
    expect(section).to_contain_text("Everything checks out")
    expect(section.locator('[data-step="basic"]')).to_contain_text("wizard-walk")
    expect(section.locator('[data-step="training"]')).to_contain_text("TOKEN=******")
    expect(section.locator("#rest-body-json")).to_contain_text('"fault-tolerance/job-retry-num": "4"')
    expect(checklist.get_by_label("The training script saves and resumes checkpoints.")).to_be_checked()
    shot(page, "07-review")

    # Back keeps everything.
    page.locator(".steps").get_by_role("button", name=re.compile("Training configuration")).click()
    section = step(page, "Training configuration")
    expect(section.locator('input[name="environments-1-value"]')).to_have_value("s3cret")
    page.locator(".steps").get_by_role("button", name=re.compile("Review and submit")).click()
    step(page, "Review and submit").page.get_by_role("button", name="Submit", exact=True).click()

    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    job = TrainingJob.objects.get(name="wizard-walk")
    assert (job.fault_tolerance, job.max_restarts, job.unconditional_restart, job.hang_restart) == (True, 4, True, True)
    assert job.environment_dict() == {"GREETING": "the wizard", "TOKEN": "s3cret"}
    assert job.tags == [{"key": "team", "value": "nlp"}]
    expect(page.locator("#job-header .phase")).to_have_attribute("data-phase", "Running")
    shot(page, "08-submitted")


def test_limits_are_refused_next_to_the_field_and_nothing_is_created(demo, new_page):
    page = new_page()
    log_in(page, "owner", "owner-password")
    open_wizard(page)
    mark_document(page)

    section = next_step(page, "Basic information")
    section.get_by_label("Description").fill("no <tags> please")
    section.get_by_label("Name").click()
    expect(page.locator("#errors-description")).to_contain_text("Description")
    # Next refuses while the step has a bad value.
    page.locator(".wizard-actions").get_by_role("button", name="Next").click()
    step(page, "Basic information")
    expect(page.locator(".steps li.current")).to_have_class(re.compile(r"\bhas-errors\b"))
    shot(page, "10-description-refused")
    section.get_by_label("Description").fill("")

    page.locator(".steps").get_by_role("button", name=re.compile("High availability")).click()
    section = step(page, "High availability")
    expect(section.get_by_label("Max restarts")).to_be_hidden()
    section.get_by_label("Fault tolerance (automatic restart)").check()
    section.get_by_label("Max restarts").fill("129")
    section.get_by_label("Instance rescheduling count").click()
    expect(page.locator("#errors-max_restarts")).to_contain_text("Max restarts must be between 1 and 128")

    page.locator(".steps").get_by_role("button", name=re.compile("Access")).click()
    section = step(page, "Access")
    section.get_by_label("SSH remote development").check()
    section.get_by_label("Generate mutual-trust SSH files").check()
    section.get_by_label("Mutual-trust SSH files dir").click()
    expect(page.locator("#errors-mutual_trust")).to_contain_text("SSH remote development")

    # The review lists what is left to fix, by step, and Submit stays off.
    page.locator(".steps").get_by_role("button", name=re.compile("Review and submit")).click()
    section = step(page, "Review and submit")
    expect(section.locator(".review-section.has-errors")).to_have_count(2)  # HA, access (the command has a default)
    expect(page.get_by_role("button", name="Submit", exact=True)).to_be_disabled()
    expect(page.locator(".steps li.has-errors")).to_have_count(2)
    shot(page, "11-review-problems")
    assert_not_reloaded(page)
    assert not TrainingJob.objects.exists()


def test_preset_template_and_env_file_import_fill_the_training_step(demo, new_page, tmp_path):
    from jobs.models import PresetImage

    PresetTemplate.objects.create(
        name="qwen-sft",
        brand="Qwen",
        type=PresetTemplate.Type.TEXT_GENERATION,
        image=PresetImage.objects.get(name="busybox"),
        command="echo fine-tuning $EPOCHS",
        environments=[{"name": "EPOCHS", "value": "3"}],
    )
    page = new_page()
    log_in(page, "owner", "owner-password")
    open_wizard(page)
    page.locator(".steps").get_by_role("button", name=re.compile("Training configuration")).click()
    section = step(page, "Training configuration")
    # The picker is filtered by the server: wait until the wizard was swapped for the answer.
    page.evaluate("document.getElementById('wizard').dataset.stale = '1'")
    section.get_by_label("Template brand").select_option("Qwen")
    page.wait_for_function("() => !document.getElementById('wizard').dataset.stale")
    section = step(page, "Training configuration")
    expect(section.get_by_label("Template brand")).to_have_value("Qwen")
    section.get_by_label("Preset template").select_option("qwen-sft")
    expect(page.locator(".notice")).to_contain_text("Filled from the preset template qwen-sft")
    section = step(page, "Training configuration")
    expect(section.get_by_label("Start command")).to_have_value("echo fine-tuning $EPOCHS")
    expect(section.locator('input[name="environments-0-name"]')).to_have_value("EPOCHS")

    env_file = tmp_path / "vars.env"
    env_file.write_text("LR=0.001\nexport BATCH='32'\n")
    section.get_by_label("Import env vars from a file").set_input_files(str(env_file))
    section.get_by_role("button", name="Import", exact=True).click()
    expect(page.locator(".notice")).to_contain_text("Env vars imported.")
    section = step(page, "Training configuration")
    expect(section.locator('input[name="environments-2-value"]')).to_have_value("32")

    too_many = tmp_path / "big.env"
    too_many.write_text("".join(f"V{i}=x\n" for i in range(99)))
    section.get_by_label("Import env vars from a file").set_input_files(str(too_many))
    section.get_by_role("button", name="Import", exact=True).click()
    expect(page.locator("#errors-env_file")).to_contain_text("at most 100 env vars in total. Nothing was imported.")
    expect(step(page, "Training configuration").locator('input[name="environments-3-name"]')).to_have_count(1)
    shot(page, "12-template-and-import")


def test_copy_a_job_from_its_page(demo, new_page):
    from tests.helpers import submit_job

    job = submit_job(
        demo,
        name="original",
        command="sleep 60",
        fault_tolerance=True,
        max_restarts=7,
        environments=[{"name": "A", "value": "1", "sensitive": False}, {"name": "K", "value": "x", "sensitive": True}],
    )
    page = new_page()
    log_in(page, "owner", "owner-password")
    page.goto(f"/jobs/{job.id}/")
    # The header is redrawn live while the job starts, and the socket's first message redraws it
    # whatever changed: the click is made as a user would, at once (the page holds what the socket
    # sends while a press is on, test_browser_press.py).
    expect(page.locator("#job-header")).to_contain_text("Running")
    page.locator("#job-header").get_by_role("link", name="Copy").click()
    expect(page.locator(".notice")).to_contain_text("Copied from original. Sensitive env var values are not copied")
    page.locator(".steps").get_by_role("button", name=re.compile("Basic information")).click()
    expect(step(page, "Basic information").get_by_label("Name")).to_have_value("original-copy")
    page.locator(".steps").get_by_role("button", name=re.compile("Training configuration")).click()
    section = step(page, "Training configuration")
    expect(section.get_by_label("Start command")).to_have_value("sleep 60")
    expect(section.locator('input[name="environments-1-value"]')).to_have_value("")
    section.locator('input[name="environments-1-value"]').fill("y")
    page.locator(".steps").get_by_role("button", name=re.compile("High availability")).click()
    expect(step(page, "High availability").get_by_label("Max restarts")).to_have_value("7")
    shot(page, "13-copy")
    page.locator(".steps").get_by_role("button", name=re.compile("Review and submit")).click()
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    copy = TrainingJob.objects.get(name="original-copy")
    assert copy.environment_dict() == {"A": "1", "K": "y"} and copy.max_restarts == 7
    wait_for(lambda: TrainingJob.objects.get(id=copy.id).phase == Phase.RUNNING, message="the copy to run")


def test_the_code_dir_is_picked_in_the_object_storage_browser(demo, new_page, settings):
    """The wizard's "Browse object storage…" opens the storage browser in a dialog; the chosen
    folder fills the field, which is then checked like a typed value (SPEC §3 code dir limits)."""
    import shutil
    import uuid
    from pathlib import Path

    from jobs.models import Bucket

    bucket_name = f"wizard-{uuid.uuid4().hex[:8]}"
    Bucket.objects.create(name=bucket_name, workspace=demo.workspace)  # the owner's workspace's bucket
    bucket = Path(settings.OBJECT_STORAGE_ROOT) / bucket_name
    (bucket / "mnist" / "data").mkdir(parents=True)
    (bucket / "mnist" / "train.py").write_text("print('train')\n")
    try:
        page = new_page()
        log_in(page, "owner", "owner-password")
        open_wizard(page)
        page.locator(".steps").get_by_role("button", name=re.compile("Training configuration")).click()
        section = step(page, "Training configuration")
        section.locator("#field-code_dir").get_by_role("button", name="Browse object storage…").click()
        dialog = page.locator("dialog#storage-dialog")
        dialog.get_by_role("link", name=bucket_name).click()
        dialog.get_by_role("link", name="mnist").click()
        # The folder's listing replaces the bucket's (htmx): until then "Use this folder" is the
        # bucket's own (a full run clicked it, and got obs://<bucket>/).
        use = dialog.get_by_role("button", name="Use this folder").first
        expect(use).to_have_attribute("data-storage-use", f"obs://{bucket_name}/mnist/")
        shot(page, "14-code-dir-picker")
        use.click()
        expect(dialog).to_be_hidden()
        expect(section.get_by_label("Code dir", exact=True)).to_have_value(f"obs://{bucket_name}/mnist/")
        expect(page.locator("#errors-code_dir")).to_be_empty()
        # The preview shows where the picked code will be (after a refresh of the step).
        section.locator("#runtime-preview").get_by_role("button", name="Refresh").click()
        expect(page.locator("#runtime-preview")).to_contain_text("/home/ma-user/modelarts/user-job-dir/mnist")
        shot(page, "15-runtime-preview")
    finally:
        shutil.rmtree(bucket, ignore_errors=True)


@pytest.mark.parametrize(
    ("scenario", "expected"),
    [
        ("Single node", dict(node_count=1, max_restarts=3, unconditional_restart=False, hang_restart=False)),
        (
            "Multi-node multi-card",
            dict(node_count=2, max_restarts=10, unconditional_restart=True, hang_restart=True, pod_retry_num=1),
        ),
        (
            "Long-running large-model training",
            dict(node_count=1, max_restarts=20, unconditional_restart=True, hang_restart=True, pod_retry_num=1),
        ),
    ],
)
def test_one_job_of_each_scenario_preset_runs_with_its_settings(demo, new_page, scenario, expected):
    page = new_page()
    log_in(page, "owner", "owner-password")
    open_wizard(page)
    page.locator(".scenario-cards").get_by_text(scenario, exact=True).click()
    expect(page.locator("#scenario-checklist h2")).to_have_text(f"{scenario}: checklist")
    name = "scenario-" + scenario.split()[0].lower()
    page.locator(".steps").get_by_role("button", name=re.compile("Basic information")).click()
    step(page, "Basic information").get_by_label("Name").fill(name)
    page.locator(".steps").get_by_role("button", name=re.compile("Training configuration")).click()
    section = step(page, "Training configuration")
    section.get_by_label("Image", exact=True).fill(BUSYBOX)
    section.get_by_label("Start command").fill("echo rank $RANK of $WORLD_SIZE; sleep 60")
    page.locator(".steps").get_by_role("button", name=re.compile("Review and submit")).click()
    expect(step(page, "Review and submit")).to_contain_text("Everything checks out")
    page.get_by_role("button", name="Submit", exact=True).click()
    page.wait_for_url(re.compile(r"/jobs/[0-9a-f-]{36}/$"))
    job = TrainingJob.objects.get(name=name)
    assert job.fault_tolerance
    assert {k: getattr(job, k) for k in expected} == expected
    expect(page.locator("#job-header .phase")).to_have_attribute("data-phase", "Running")
    expect(page.locator("#restarts")).to_have_text(f"Restarts 0/{expected['max_restarts']}")
    assert job.attempts.first().task_runs.count() == expected["node_count"]


def test_the_defaults_alone_make_a_job_that_runs(demo, new_page, docker_client):
    """A user who opens the wizard and submits at once gets a job that completes: the default
    image and command agree."""
    page = new_page()
    log_in(page, "owner", "owner-password")
    open_wizard(page)
    page.locator(".wizard-actions").get_by_role("button", name="Skip to review").click()
    step(page, "Review and submit")
    expect(page.locator("#review")).to_contain_text("Everything checks out.")
    page.locator(".wizard-actions").get_by_role("button", name="Submit").click()
    job = wait_for(lambda: TrainingJob.objects.first(), message="the job created")
    wait_for(lambda: TrainingJob.objects.get(id=job.id).is_final, timeout=60, message="the job to end")
    job.refresh_from_db()
    assert job.phase == Phase.COMPLETED, job.phase_reason
    from jobs.runtime.logs import read_lines

    run = job.attempts.get().task_runs.get()
    assert any(line.text.startswith(f"hello from {job.name} on ") for line in read_lines(run))
