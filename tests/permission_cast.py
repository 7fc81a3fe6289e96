"""Callers and their rights, as the permission tests make and use them: a granted permission, an
auditor (a member who may list all jobs), a caller signed in by the browser's session or by an API
token, and the bodies of a job created by the form and by the API."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.test import Client
from rest_framework.authtoken.models import Token
from rest_framework.test import APIClient

from tests.helpers import BUSYBOX, api_client


def grant(user, codename: str):
    user.user_permissions.add(Permission.objects.get(codename=codename, content_type__app_label="jobs"))
    return get_user_model().objects.get(pk=user.pk)  # a fresh object: has_perm caches


def make_auditor(workspace):
    """A workspace member who holds "may list all jobs"."""
    auditor = get_user_model().objects.create_user("auditor", password="auditor-password")
    workspace.members.add(auditor)
    return grant(auditor, "list_all_jobs")


def signed_in(user) -> Client:
    """Django's test client, signed in as `user` (a browser's session)."""
    client = Client()
    client.force_login(user)
    return client


def api_as(user) -> APIClient:
    """DRF's test client with `user`'s API token (made if the user has none)."""
    token, _ = Token.objects.get_or_create(user=user)
    return api_client(token.key)


def create_form(workspace, name: str, **extra) -> dict:
    return {
        "workspace": workspace.id,
        "name": name,
        "image": BUSYBOX,
        "command": "echo created",
        "node_count": 1,
        "max_restarts": 3,
        "pod_retry_num": 0,
        **extra,
    }


def api_body(name: str, **spec) -> dict:
    return {
        "kind": "job",
        "metadata": {"name": name, "annotations": {}},
        "algorithm": {"command": "echo api", "engine": {"image_url": BUSYBOX}},
        "spec": {"resource": {"node_count": 1}, **spec},
    }
