"""Demo data for the run command: a user, a workspace, the local Docker host, preset images."""

import shutil

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from jobs.models import DockerHost, PresetImage, ResourcePool, Workspace

DEMO_USER, DEMO_PASSWORD = "demo", "demo-password"
PRESETS = [
    ("busybox", "console/busybox:latest", "BusyBox shell tools; for quick jobs."),
    ("python-3.11-numpy", "console/python:3.11", "Python 3.11 with NumPy (CPU)."),
]


class Command(BaseCommand):
    help = "Create the demo account, workspace, local Docker host and preset images (idempotent)."

    def handle(self, *args, **options):
        user, created = get_user_model().objects.get_or_create(
            username=DEMO_USER, defaults={"is_staff": True, "is_superuser": True}
        )
        if created:
            user.set_password(DEMO_PASSWORD)
            user.save()
        workspace, _ = Workspace.objects.get_or_create(name="demo")
        workspace.members.add(user)
        pool, created = ResourcePool.objects.get_or_create(name="default")
        free_gb = shutil.disk_usage(settings.VAR_DIR).free / 2**30
        if created and free_gb < 2 * pool.check_root_gb:
            # SPEC §5's 32 GB would isolate a small demo machine at once.
            pool.check_root_gb = pool.check_cache_gb = max(0.5, round(free_gb / 4, 1))
            pool.save()
            self.stdout.write(f"note disk thresholds lowered to {pool.check_root_gb} GB (free: {free_gb:.0f} GB)")
        host, _ = DockerHost.objects.get_or_create(name="local", defaults={"base_url": settings.DEFAULT_DOCKER_URL})
        if host.pool is None:
            host.pool = pool
            host.save(update_fields=["pool"])
        for name, ref, description in PRESETS:
            PresetImage.objects.update_or_create(name=name, defaults={"image_ref": ref, "description": description})
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(f"login {DEMO_USER} / {DEMO_PASSWORD}")
        self.stdout.write(f"project_id {workspace.project_id}")
        self.stdout.write(f"api_token {token.key}")
