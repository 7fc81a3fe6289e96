"""The demo's rows every test that needs a workspace gets (the `demo` fixture, tests/conftest.py):
an owner, a member and an outsider, the local Docker host, a pool and the preset images."""

from __future__ import annotations

import functools

from django.conf import settings

from tests.helpers import BUSYBOX, PYTHON_IMAGE


@functools.cache
def _password_hash(password: str, hashers: tuple[str, ...]) -> str:
    """A real hash of the password, made once a session (the hasher's work per user and test was
    most of a validation test's time). Logging in with it checks it as usual."""
    from django.contrib.auth.hashers import make_password

    return make_password(password)


# Every bucket name the tests use with the demo workspace (tests/test_storage_tenancy.py uses others).
DEMO_BUCKETS = (
    "art-b", "b01", "bk-b", "bk-code-b", "bkt", "bucket", "ckpt-b", "cleanup-bucket", "code-b", "contract-b",
    "copy-b", "data-1", "data-b", "demo", "gone-b", "good", "logs-b", "mnt-b", "nobucket", "nowhere-b", "out-b",
)  # fmt: skip


def make_demo():
    """The demo's rows (see `demo`); a module's fixture that commits them calls it itself."""
    from django.contrib.auth import get_user_model
    from rest_framework.authtoken.models import Token

    from jobs.models import Bucket, DockerHost, PresetImage, ResourcePool, Workspace

    def user(name: str):  # password: "<name>-password"
        password = _password_hash(f"{name}-password", tuple(settings.PASSWORD_HASHERS))
        return get_user_model().objects.create(username=name, password=password)

    owner, member, outsider = user("owner"), user("member"), user("outsider")
    workspace = Workspace.objects.create(name="team")
    workspace.members.add(owner, member)
    Workspace.objects.create(name="elsewhere").members.add(outsider)
    # Workspaces own their storage: the buckets the tests' jobs use are the team's (registering a
    # name does not make its folder; the tests that need one make it).
    Bucket.objects.bulk_create(Bucket(name=name, workspace=workspace) for name in DEMO_BUCKETS)
    # Small thresholds: the environment checks must pass on a small test disk.
    pool = ResourcePool.objects.create(name="test-pool", check_root_gb=0.5, check_cache_gb=0.5)
    host = DockerHost.objects.create(name="local", base_url=settings.DEFAULT_DOCKER_URL, pool=pool)
    PresetImage.objects.create(name="busybox", image_ref=BUSYBOX)
    PresetImage.objects.create(name="python-3.11-numpy", image_ref=PYTHON_IMAGE)

    class Demo:
        pass

    d = Demo()
    d.owner, d.member, d.outsider, d.workspace, d.host, d.pool = owner, member, outsider, workspace, host, pool
    d.token = Token.objects.create(user=owner).key
    d.outsider_token = Token.objects.create(user=outsider).key
    return d
