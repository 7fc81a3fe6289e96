"""Demo data for the run command: a user, a workspace, the local Docker host, preset images."""

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from jobs.models import DockerHost, PresetImage, Workspace

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
        DockerHost.objects.get_or_create(name="local", defaults={"base_url": settings.DEFAULT_DOCKER_URL})
        for name, ref, description in PRESETS:
            PresetImage.objects.update_or_create(name=name, defaults={"image_ref": ref, "description": description})
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(f"login {DEMO_USER} / {DEMO_PASSWORD}")
        self.stdout.write(f"project_id {workspace.project_id}")
        self.stdout.write(f"api_token {token.key}")
