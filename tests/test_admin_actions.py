"""The admin's actions are checked where they are used: a view-only operator can look at hosts
and jobs but cannot clear an isolation or force-stop a job (issue "Tenancy and a production
mode": admin actions declare their permission)."""

import pytest
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client

from jobs.models import DockerHost, Phase, TrainingJob
from tests.helpers import BUSYBOX


def staff(name: str, *codenames: str) -> Client:
    user = get_user_model().objects.create_user(name, password=f"{name}-password", is_staff=True)
    user.user_permissions.add(*Permission.objects.filter(codename__in=codenames))
    client = Client()
    client.force_login(user)
    return client


def isolated_host() -> DockerHost:
    host = DockerHost.objects.create(name="faulty", base_url="unix:///nonexistent.sock")
    DockerHost.objects.filter(id=host.id).update(isolated=True, isolation_reason="lost connection")
    return host


def pending_job(demo) -> TrainingJob:
    job = TrainingJob(workspace=demo.workspace, created_by=demo.owner, name="queued", image=BUSYBOX, command="true")
    job.full_clean()
    job.save()
    TrainingJob.objects.filter(id=job.id).update(phase=Phase.PENDING)
    return job


@pytest.mark.django_db
def test_a_view_only_operator_cannot_clear_an_isolation(demo):
    host = isolated_host()
    viewer = staff("viewer", "view_dockerhost")
    assert viewer.get("/admin/jobs/dockerhost/").status_code == 200  # may look
    response = viewer.post("/admin/jobs/dockerhost/", {"action": "clear_isolation", "_selected_action": [host.id]})
    assert response.status_code in (200, 302)
    assert DockerHost.objects.get(id=host.id).isolated  # nothing changed

    changer = staff("changer", "view_dockerhost", "change_dockerhost")
    response = changer.post(
        "/admin/jobs/dockerhost/", {"action": "clear_isolation", "_selected_action": [host.id]}, follow=True
    )
    assert "Cleared isolation of 1 host(s)." in response.content.decode()
    assert not DockerHost.objects.get(id=host.id).isolated
    # Seen on the operator's word: a first slow ping does not isolate it again (runtime/liveness.py).
    assert DockerHost.objects.get(id=host.id).last_seen_at is not None


@pytest.mark.django_db
def test_a_view_only_operator_cannot_force_stop_a_job(demo):
    job = pending_job(demo)
    viewer = staff("viewer", "view_trainingjob")
    assert viewer.get("/admin/jobs/trainingjob/").status_code == 200
    viewer.post("/admin/jobs/trainingjob/", {"action": "force_stop", "_selected_action": [str(job.id)]})
    job.refresh_from_db()
    assert not job.terminate_requested and job.phase == Phase.PENDING


@pytest.mark.django_db
def test_the_admin_deletes_ended_jobs_only(demo):
    """As the API: a job that has not ended is not deleted (its start may still be writing its
    files, its containers still run); force stop it first. The bulk action refuses a choice that
    holds one, and deletes ended jobs."""
    running = pending_job(demo)
    ended = pending_job(demo)
    TrainingJob.objects.filter(id=ended.id).update(phase=Phase.COMPLETED)
    operator = Client()
    operator.force_login(get_user_model().objects.create_superuser("root", password="root-password"))
    assert operator.post(f"/admin/jobs/trainingjob/{running.id}/delete/", {"post": "yes"}).status_code == 403

    def bulk_delete(*jobs):
        selected = [str(job.id) for job in jobs]
        return operator.post(
            "/admin/jobs/trainingjob/", {"action": "delete_selected", "_selected_action": selected, "post": "yes"}
        )

    assert bulk_delete(running, ended).status_code == 403
    assert TrainingJob.objects.count() == 2
    assert bulk_delete(ended).status_code == 302
    assert list(TrainingJob.objects.values_list("id", flat=True)) == [running.id]
