"""Demo data for the run command: a user, a workspace, the local Docker host in a public and
a dedicated pool, preset images, flavors, a preset template with its code in object storage,
a preset dataset and a shared file system: enough to try every step of the create wizard."""

import os
import shutil
from pathlib import Path

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token

from jobs.models import (
    Bucket,
    Dataset,
    DockerHost,
    FileSystem,
    Flavor,
    PresetImage,
    PresetTemplate,
    ResourcePool,
    Workspace,
)

DEMO_USER, DEMO_PASSWORD = "demo", "demo-password"
PRESETS = [
    ("busybox", "console/busybox:latest", "BusyBox shell tools; for quick jobs."),
    ("python-3.11-numpy", "console/python:3.11", "Python 3.11 with NumPy (CPU)."),
    # Built by scripts/setup.sh for the run command (jobs/proxy/ opens them through the console).
    ("notebook-3.11", "console/notebook:3.11", "Python 3.11 with NumPy, JupyterLab and TensorBoard."),
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
        self._catalogue(pool)
        # The demo bucket is the demo workspace's: no other workspace's user or job reaches it.
        Bucket.objects.update_or_create(name="demo", defaults={"workspace": workspace})
        FileSystem.objects.get(name="shared").workspaces.add(workspace)
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(f"login {DEMO_USER} / {DEMO_PASSWORD}")
        self.stdout.write(f"project_id {workspace.project_id}")
        self.stdout.write(f"api_token {token.key}")

    def _catalogue(self, public: ResourcePool) -> None:
        """Flavors, a dedicated pool on the same engine, a template, a dataset, a file system."""
        for name, cpus, memory_mb in (("cpu.1u2g", 1, 2048), ("cpu.2u4g", 2, 4096)):
            Flavor.objects.update_or_create(name=name, defaults={"cpus": cpus, "memory_mb": memory_mb})
        # The same Docker engine again as the one node of a dedicated pool (its size: this machine).
        memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        dedicated, _ = ResourcePool.objects.update_or_create(
            name="team-pool",
            defaults={
                "kind": ResourcePool.Kind.DEDICATED,
                "node_cpus": os.cpu_count() or 1,
                "node_memory_gb": round(memory_gb, 1),
                "check_root_gb": public.check_root_gb,
                "check_cache_gb": public.check_cache_gb,
            },
        )
        DockerHost.objects.get_or_create(
            name="local-dedicated", defaults={"base_url": settings.DEFAULT_DOCKER_URL, "pool": dedicated}
        )
        # Object storage: the spiral MLP of examples/ as a code dir, a small dataset, output folders.
        root = Path(settings.OBJECT_STORAGE_ROOT) / "demo"
        code = root / "code" / "spiral"
        code.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(Path(settings.BASE_DIR) / "examples" / "train_checkpoint.py", code / "train.py")
        (code / "run.sh").write_text('#!/bin/sh\ncd "$(dirname "$0")" && exec python3 train.py "$@"\n')
        data = root / "datasets" / "spiral"
        data.mkdir(parents=True, exist_ok=True)
        (data / "README.md").write_text("The spiral data set is generated from a fixed seed by train.py.\n")
        for folder in ("outputs", "logs", "backup"):
            (root / folder).mkdir(exist_ok=True)
        python = PresetImage.objects.get(name="python-3.11-numpy")
        PresetTemplate.objects.update_or_create(
            name="spiral-mlp",
            defaults={
                "brand": "Demo",
                "type": PresetTemplate.Type.IMAGE_UNDERSTANDING,
                "description": "A small MLP that checkpoints and resumes",
                "image": python,
                # The final checkpoint becomes the job's artifact when the job stores artifacts.
                "command": "cd ${MA_JOB_DIR}/spiral && python3 train.py && "
                'if [ -n "$MA_ARTIFACT_DIR" ]; then cp "$MA_CHECKPOINT_DIR"/* "$MA_ARTIFACT_DIR"/; fi',
                "code_dir": "obs://demo/code/spiral/",
                "environments": [{"name": "TRAIN_STEPS", "value": "300"}],
            },
        )
        Dataset.objects.update_or_create(
            name="spiral", owner=None, defaults={"path": "obs://demo/datasets/spiral/", "description": "Demo data"}
        )
        shared = Path(settings.VAR_DIR) / "shared-fs"
        shared.mkdir(parents=True, exist_ok=True)
        FileSystem.objects.update_or_create(
            name="shared", defaults={"kind": FileSystem.Kind.HOST_DIR, "source": str(shared.resolve())}
        )
